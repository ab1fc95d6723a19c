"""The batch layout of a run: global batch = micro-batch x accumulation x processes, steps per epoch, total steps;
a layout that does not divide fails with the setting to change."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from leantrain.config import Config, largest_divisor
from leantrain.errors import ConfigError


@dataclass
class BatchLayout:
    """Batch arithmetic: global batch = micro batch x accumulation x processes; steps per epoch and in all."""

    batch_size: int
    micro_batch_size: int
    accum: int
    world_size: int
    steps_per_epoch: int
    total_steps: int
    notes: list[str] = field(default_factory=list)


def batch_layout(cfg: Config, train_rows: int, world_size: int, micro_batch_size: int | None = None) -> BatchLayout:
    """``micro_batch_size`` overrides the config's (``train.micro_batch_size=auto`` once it is chosen); while
    ``auto`` is unresolved the layout uses the whole per-process batch."""
    t = cfg.train
    if t.batch_size % world_size:
        raise ConfigError(
            f"train.batch_size={t.batch_size} does not divide over {world_size} processes; "
            f"use a multiple of {world_size}, e.g. {math.ceil(t.batch_size / world_size) * world_size}"
        )
    per_proc = t.batch_size // world_size
    micro = micro_batch_size or (t.micro_batch_size if isinstance(t.micro_batch_size, int) else per_proc)
    if per_proc % micro:
        raise ConfigError(
            f"train.micro_batch_size={micro} does not divide the per-process batch {per_proc} "
            f"(train.batch_size={t.batch_size} / {world_size} processes): use train.micro_batch_size="
            f"{largest_divisor(per_proc, micro)}, or train.batch_size={math.ceil(per_proc / micro) * micro * world_size}"
        )
    accum = per_proc // micro
    full, rest = divmod(train_rows, t.batch_size)
    steps_per_epoch = full + (1 if rest and not cfg.data.drop_last else 0)
    if steps_per_epoch == 0:
        raise ConfigError(
            f"no training step: {train_rows} rows and data.drop_last=true with train.batch_size={t.batch_size}"
        )
    total = t.max_steps if t.max_steps > 0 else max(1, math.ceil(t.epochs * steps_per_epoch))
    notes = [
        f"batch: global {t.batch_size} = micro {micro} x accumulation {accum} x {world_size} process(es); "
        f"{steps_per_epoch} steps/epoch, {total} steps"
    ]
    return BatchLayout(t.batch_size, micro, accum, world_size, steps_per_epoch, total, notes)
