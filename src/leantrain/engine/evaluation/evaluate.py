"""Evaluation: outputs gathered from every process with ``gather_for_metrics`` (padding duplicates dropped); the
task turns each gathered batch into per-unit values and those, over the whole eval set, into its metrics
(classification: loss, accuracy, macro-F1 and, for two classes, MCC). A long evaluation reports its batches and
rows to the open ``heartbeat`` sink."""

from __future__ import annotations

import torch

from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

from leantrain.heartbeat import work
from leantrain.methods import Task, model_inputs


def _same_width(accelerator: Accelerator, values: torch.Tensor, labels: torch.Tensor | None = None) -> tuple:
    """(values, labels) ready to gather: per-token outputs (token classification: logits ``(batch, tokens, tags)``,
    labels ``(batch, tokens)``) are as wide as the longest batch of any process, so they are padded to the widest
    (values with 0, labels with -100: no target); labels None are left out."""
    if values.dim() > 2 and accelerator.num_processes > 1:
        values = accelerator.pad_across_processes(values, dim=1)
        labels = labels if labels is None else accelerator.pad_across_processes(labels, dim=1, pad_index=-100)
    return (values, labels) if labels is not None else (values,)


@torch.no_grad()
def predict_logits(model: nn.Module, loader: DataLoader, accelerator: Accelerator) -> torch.Tensor:
    """Yield gathered (logits, labels-or-None) per batch, for every process's shard, duplicates dropped."""
    was_training = model.training
    model.eval()
    try:
        for batch in loader:
            logits, labels = model(**model_inputs(batch)).logits.float(), batch.get("labels")
            yield accelerator.gather_for_metrics(_same_width(accelerator, logits, labels))
    finally:
        model.train(was_training)


@torch.no_grad()
def eval_outputs(model: nn.Module, loader: DataLoader, accelerator: Accelerator, task: Task):
    """Yield what the task gathers of each eval batch (``Task.evaluation.outputs``, which runs the forward: logits and
    labels by default), from every process's shard, duplicates dropped."""
    was_training = model.training
    model.eval()
    try:
        for batch in loader:
            yield accelerator.gather_for_metrics(_same_width(accelerator, *task.evaluation.outputs(model, batch)))
    finally:
        model.train(was_training)


def evaluate(model: nn.Module, loader: DataLoader, accelerator: Accelerator, num_labels: int, task: Task,
             label_names: list[str] | None = None, stop=None) -> dict | None:  # noqa: ANN001 - stop: () -> bool
    """The task's metrics over the loader; None when ``stop()`` turns true between batches (a signal)."""
    values: dict[str, list[torch.Tensor]] = {}
    rows = 0
    with work("eval", len(loader), "batches") as progress:
        for batches, gathered in enumerate(eval_outputs(model, loader, accelerator, task), 1):
            if stop is not None and stop():
                return None
            for key, value in task.evaluation.batch(*gathered).items():
                values.setdefault(key, []).append(value.cpu())
            rows += len(gathered[0])
            if progress.due():  # the rows of every process (gathered)
                progress.update(batches, {"rows": rows})
    if not values:
        return {}
    values = {k: torch.cat(v).numpy() for k, v in values.items()}
    ev = task.evaluation
    return ev.metrics(values, num_labels) if label_names is None else ev.all_metrics(values, label_names)
