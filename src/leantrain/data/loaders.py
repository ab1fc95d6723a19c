"""DataLoaders over processed datasets: the training loader follows this rank's share of the global batches;
the evaluation loader reads in length order (least padding) and is sharded by Accelerate."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from leantrain.data.batching import EpochMicroBatches, WeightedView, epoch_batches
from leantrain.data.text import TextCollator
from leantrain.processes import bind_to_parent


def make_collator(tokenizer, *, batching: str, max_length: int, pad_multiple: int | None = None) -> TextCollator:
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return TextCollator(pad_id, pad_to=max_length if batching == "padded" else None, multiple_of=pad_multiple)


def epoch_micro_batches(dataset, *, batch_size: int, seed: int, epoch: int, batching: str, group_size: int,
               drop_last: bool, rank: int, world_size: int, accum: int, start_step: int = 0) -> EpochMicroBatches:
    """This rank's micro-batches of one epoch, from the dataset's lengths (see ``epoch_batches``)."""
    lengths = np.asarray(dataset["length"])
    batches = epoch_batches(lengths, batch_size, seed=seed, epoch=epoch, batching=batching,
                            group_size=group_size, drop_last=drop_last)
    return EpochMicroBatches(batches, rank=rank, world_size=world_size, accum=accum, start_step=start_step)


def train_loader(dataset, micro_batches: EpochMicroBatches, collator, *, num_workers: int = 0, pin_memory: bool = False) -> DataLoader:
    return DataLoader(
        WeightedView(dataset, dataset.column_names),  # processed: model inputs, [labels], length
        batch_sampler=micro_batches,
        collate_fn=collator,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=False,
        generator=_own_generator(),
        worker_init_fn=bound_worker,
    )


def eval_loader(dataset, batch_size: int, collator, *, num_workers: int = 0) -> DataLoader:
    """Longest first, so an out-of-memory shows at once; the order does not change any metric."""
    order = np.argsort(-np.asarray(dataset["length"]), kind="stable").tolist()
    return DataLoader(
        WeightedView(dataset, dataset.column_names),
        batch_size=batch_size,
        sampler=order,
        collate_fn=collator,
        num_workers=num_workers,
        generator=_own_generator(),
        worker_init_fn=bound_worker,
    )


def bound_worker(worker_id: int) -> None:
    """A DataLoader worker (``data.num_workers``) dies with the process it loads for, at once and silently: torch's
    own watchdog notices a dead parent only within 5 s, time in which a SIGKILLed run's workers printed
    ConnectionResetError (``leantrain.processes``, as every process leantrain starts)."""
    bind_to_parent()


def _own_generator() -> torch.Generator:
    """Starting a DataLoader iterator draws a worker seed from its generator; with the global one that draw would
    shift dropout's random stream by whether (and how often) loaders were started, which breaks exact resume."""
    return torch.Generator().manual_seed(0)


def to_device(batch: dict, device: torch.device, non_blocking: bool = False) -> dict:
    """A loaded batch's tensors on ``device``; its other entries (a method's texts or reward columns, as lists) as
    they are."""
    return {k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
