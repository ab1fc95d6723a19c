"""The optimizer with its parameter groups (the classifier head's own learning rate) and the schedule, built where the
model is placed for the strategy: DDP wraps it through Accelerate's prepare; FSDP2 shards it before the optimizer is
built, so the optimizer state is sharded too."""

from __future__ import annotations

import logging

from accelerate import Accelerator
from torch import nn

from leantrain.config import Config
from leantrain.engine.devices.batch_layout import BatchLayout
from leantrain.engine.devices.distributed import CommStats, apply_fsdp, count_fsdp_traffic, strategy_name, time_allreduce
from leantrain.engine.setup.training_data import TrainingData
from leantrain.modeling.head_start import head_group
from leantrain.optim import build_optimizer, build_scheduler

log = logging.getLogger("leantrain")


def optimizer_and_schedule(cfg: Config, model: nn.Module, data: TrainingData, total_steps: int):
    """The optimizer over ``model``'s parameters (a classifier head in its own group at its own rate, when the task
    or ``train.head_lr`` asks for one) and its learning-rate schedule."""
    head, head_lr = head_group(model, len(data.label_names), cfg.train.lr, cfg.train.head_lr,
                               data.task.traits.head_lr_factor)
    if head:
        log.info("classifier head: its own learning rate %.3g (%s; the rest %.3g)", head_lr, "train.head_lr" if
                 cfg.train.head_lr is not None else f"{data.task.name}'s default, train.head_lr to change", cfg.train.lr)
    optimizer = build_optimizer(model, cfg.optim, cfg.train.lr, head, head_lr)
    return optimizer, build_scheduler(optimizer, cfg.optim, total_steps)


def place(cfg: Config, accelerator: Accelerator, model: nn.Module, layout: BatchLayout, data: TrainingData):
    """Model, optimizer, schedule and eval data placed and wrapped for the strategy, and the communication counters."""
    strategy = strategy_name(cfg, accelerator.num_processes)
    comm = CommStats()
    if strategy == "fsdp":
        model = apply_fsdp(model, accelerator)
        count_fsdp_traffic(model, comm)
    optimizer, scheduler = optimizer_and_schedule(cfg, model, data, layout.total_steps)
    eval_dl = data.eval_loader(layout.micro_batch_size)
    if strategy == "fsdp":
        optimizer, scheduler, eval_dl = accelerator.prepare(optimizer, scheduler, eval_dl)
    else:
        model, optimizer, scheduler, eval_dl = accelerator.prepare(model, optimizer, scheduler, eval_dl)
    if strategy == "ddp":
        time_allreduce(model, comm)
    return model, optimizer, scheduler, eval_dl, comm
