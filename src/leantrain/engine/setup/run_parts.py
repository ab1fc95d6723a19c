"""A run's parts, each held once: ``RunStart`` (before any data or model) and ``Run`` (what the loop works with and the
summary reads). What changes from step to step is the loop's ``LoopState`` (engine/training/loop_state.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

from leantrain.config import Config
from leantrain.engine.devices.batch_layout import BatchLayout
from leantrain.engine.checkpoint.resume import Decision
from leantrain.engine.checkpoint.save import Checkpointer
from leantrain.engine.devices.distributed import CommStats
from leantrain.engine.devices.efficiency import ModelChoices
from leantrain.engine.devices.paths import Paths
from leantrain.engine.training.faults import FaultInjector
from leantrain.engine.setup.training_data import TrainingData
from leantrain.modeling.lora import Trainable
from leantrain.perf.flops import MfuMeter
from leantrain.perf.meter import Throughput
from leantrain.report.logs import MetricsLog


@dataclass
class RunStart:
    """The run before any data or model: its config (with the agreed output folder), Accelerator, precision and
    the resume decision."""

    cfg: Config
    accelerator: Accelerator
    out: Path
    decision: Decision
    precision: str
    precision_reason: str
    allocator: str


@dataclass
class Run:
    """A set-up run: its start, the placed model, optimizer, schedule and data, the logs, meters and checkpointer,
    and what the summary needs besides (parameter counts, communication, the attention / compile choices, the trainable
    part)."""

    start: RunStart
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    eval_dl: DataLoader
    data: TrainingData
    layout: BatchLayout
    metrics_log: MetricsLog
    meter: Throughput
    ckpt: Checkpointer
    flops: MfuMeter
    faults: FaultInjector
    counts: dict[str, int]
    comm: CommStats
    choices: ModelChoices
    trainable: Trainable | None = None
    paths: Paths | None = None  # the record of fast paths (engine/devices/paths.py)

    @property
    def cfg(self) -> Config:
        return self.start.cfg

    @property
    def accelerator(self) -> Accelerator:
        return self.start.accelerator
