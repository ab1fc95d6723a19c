"""Nothing hides a NaN: ``train.nonfinite`` = abort (default) or skip_step.

abort: each step folds ``isfinite(loss) & isfinite(grad_norm)`` into a device-side record of the first bad step (no
host sync); the record is read on logging steps and before every checkpoint save, where the host syncs anyway. On a
non-finite value the run stops (exit 3) naming the step, the process(es) and the batch's example indices, and writes
``output_dir/nonfinite.json``. With a fused optimizer (torch AdamW on CPU and CUDA, the default) the same device
flag is handed to the optimizer as ``found_inf`` (as GradScaler does), so from the bad step on every update is skipped
on the device: the parameters and optimizer state stay at the last finite state, which the abort writes to
``output_dir/nonfinite-state/`` (the diagnostic checkpoint: model.safetensors, optimizer and scheduler state). The
newest periodic checkpoint is finite too (the record is checked before every save), and resuming from it replays
the run exactly up to the bad step.

skip_step: before each optimizer update the gradients (already all-reduced, so every process agrees) are checked,
one host sync per step; a non-finite update is skipped, logged as a warning and a ``nonfinite`` metrics record, and
counted in summary.json (``train.skipped_steps``). The learning-rate schedule still advances.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from accelerate import Accelerator

from leantrain.config import Config
from leantrain.data.batching import epoch_batches, split_global_batch
from leantrain.engine.devices.batch_layout import BatchLayout
from leantrain.errors import UserError
from leantrain.optim import fused_torch_optimizer
from leantrain.report.logs import MetricsLog, write_json

log = logging.getLogger("leantrain")


class NonFiniteError(UserError):
    exit_code = 3


class _SkipOptimizer:
    """The optimizer, with ``step()`` skipped when any gradient is non-finite (one host sync)."""

    def __init__(self, optimizer):
        self._optimizer = optimizer
        self.skipped = False

    def step(self, *args, **kwargs):
        grads = [p.grad for g in self._optimizer.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        self.skipped = not bool(torch.isfinite(norm))
        if not self.skipped:
            return self._optimizer.step(*args, **kwargs)
        return None

    def __getattr__(self, name):
        return getattr(self._optimizer, name)


class NonFiniteGuard:
    """The run's NaN/Inf watch (see the module docstring). The train step calls ``before_update`` once per step."""

    def __init__(self, cfg: Config, accelerator: Accelerator, out: Path, lengths: np.ndarray, layout: BatchLayout,
                 last_checkpoint: Callable[[], Path | None]):
        self.mode = cfg.train.nonfinite
        self.cfg, self.accelerator, self.out, self.lengths, self.layout = cfg, accelerator, Path(out), lengths, layout
        self.last_checkpoint = last_checkpoint
        dev = accelerator.device
        self.first_bad = torch.full((), -1, dtype=torch.long, device=dev)
        self.bad_values = torch.zeros(2, device=dev)  # loss sum, grad norm at the first bad step
        self.skipped: list[int] = []
        self.frozen = torch.zeros((), dtype=torch.bool, device=dev)  # abort mode: no update after a bad step
        # under fp16's grad scaler inf gradients are routine (the scaler skips those steps): judge the loss alone
        self.use_grad_norm = getattr(accelerator, "scaler", None) is None
        self.freezes = False
        self.fused: torch.optim.Optimizer | None = None  # abort mode: the fused optimizer that takes found_inf
        self.save_diagnostic: Callable[[int], Path | None] | None = None  # (last finite step) -> folder; by the loop

    def optimizer(self, optimizer):
        """The optimizer the step uses: skip_step wraps it; abort freezes a fused one through ``found_inf``."""
        if self.mode == "skip_step":
            return _SkipOptimizer(optimizer)
        fused = fused_torch_optimizer(optimizer)
        self.freezes = fused is not None and self.use_grad_norm  # the scaler owns found_inf when there is one
        self.fused = fused if self.freezes else None
        return optimizer

    def before_update(self, step: int, loss_sum: torch.Tensor, grad_norm: torch.Tensor | None) -> None:
        """abort mode: the step's one finite check, on the device (no host sync), between the clip and the update.
        Records the first bad step; with a fused optimizer, this and every later update are skipped on the device."""
        if self.mode != "abort":
            return
        ok = torch.isfinite(loss_sum)
        if grad_norm is not None and self.use_grad_norm:
            ok = ok & torch.isfinite(grad_norm)
        first = (self.first_bad < 0) & ~ok
        self.first_bad.masked_fill_(first, step)
        values = torch.stack([loss_sum.detach().float(), (grad_norm if grad_norm is not None else loss_sum).float()])
        self.bad_values = torch.where(first, values, self.bad_values)
        if self.fused is not None:
            self.frozen |= ~ok
            self.fused.found_inf = self.frozen.float()

    def after_update(self, step: int, optimizer, metrics_log: MetricsLog) -> None:
        """skip_step mode: log and count an update the optimizer skipped."""
        if self.mode == "skip_step" and optimizer.skipped:
            self.skipped.append(step)
            rec = {"type": "nonfinite", "step": step, "action": "skipped", **self.batch_of(step)}
            metrics_log.write(rec)
            log.warning("warning: non-finite gradients at step %d: update skipped (batch rows %s)",
                        step, rec["batch"][:16])

    def check(self) -> None:
        """A collective on logging steps and before saves (abort mode): stop if any process saw a NaN/Inf."""
        if self.mode != "abort":
            return
        acc = self.accelerator
        seen = torch.zeros(acc.num_processes, dtype=torch.long, device=acc.device)
        seen[acc.process_index] = self.first_bad + 1
        if acc.num_processes > 1:
            seen = acc.reduce(seen, reduction="sum")
        seen = seen.tolist()
        if not any(seen):
            return
        step = min(s for s in seen if s) - 1
        ranks = [r for r, s in enumerate(seen) if s == step + 1]
        self._abort(step, ranks)

    def _abort(self, step: int, ranks: list[int]) -> None:
        loss_sum, norm = self.bad_values.tolist()
        frozen = self.save_diagnostic(step - 1) if self.freezes and self.save_diagnostic else None
        last = self.last_checkpoint()
        diag = {"step": step, "ranks": ranks, "epoch": (step - 1) // self.layout.steps_per_epoch,
                "loss_sum_on_rank": loss_sum if self.accelerator.process_index in ranks else None,
                "grad_norm": norm if self.cfg.train.max_grad_norm is not None else None,
                **self.batch_of(step), "last_finite_checkpoint": str(last) if last else None,
                "diagnostic_checkpoint": str(frozen) if frozen else None}
        if self.accelerator.is_main_process:
            write_json(self.out / "nonfinite.json", diag)
        where = [f"the last finite state (after step {step - 1}) is saved in {frozen}"] if frozen else []
        where.append(f"the newest checkpoint {last} is finite: resume from it to replay up to the bad step" if last
                     else "no periodic checkpoint was saved before it (set checkpoint.every_steps lower to keep one)")
        raise NonFiniteError(
            f"non-finite loss or gradient norm at optimizer step {step} on process(es) {ranks}; training stopped "
            f"(train.nonfinite=abort). Details in {self.out / 'nonfinite.json'}:",
            [f"batch rows (training-set indices) {diag['batch'][:32]}", *where,
             "train.nonfinite=skip_step skips such updates instead"])

    def batch_of(self, step: int) -> dict:
        """The global batch of optimizer step ``step`` (1-based) and each process's part, from the pure batch layout."""
        layout, d = self.layout, self.cfg.data
        epoch, index = divmod(step - 1, layout.steps_per_epoch)
        batches = epoch_batches(self.lengths, layout.batch_size, seed=self.cfg.train.seed, epoch=epoch,
                                batching=d.batching, group_size=d.group_size, drop_last=d.drop_last)
        batch = batches[index]
        parts = split_global_batch(batch, layout.world_size * layout.accum)
        per_rank = {r: [int(i) for a in range(layout.accum) for i in parts[a * layout.world_size + r] if i >= 0]
                    for r in range(layout.world_size)}
        return {"batch": [int(i) for i in batch], "batch_by_rank": per_rank}
