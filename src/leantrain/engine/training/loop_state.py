"""The loop's one state: what changes from step to step and what a checkpoint must hold to continue the run exactly.

The model, the optimizer and the schedule keep their own state; everything else the loop moves forward lives in one
``LoopState``, owned by the loop: the position (step, epoch, the first batch of the epoch a resumed run starts at,
the optimizer steps beyond one per global batch: a method may run several updates on one), the loss and the step metrics
accumulated on the device since the last log, the last evaluation, the best-model record, the random generators and
the method's own resumable state (``Task.step.state``: e.g. a sampling generator). ``state_dict()`` is what the
checkpoint writes (``trainer``: shared by every process, written by rank 0 into ``trainer_state``; ``rank``: each
process's own RNG, running loss and metrics and method state, in ``rank-<r>``) and ``load_state_dict()`` what a resume
reads back.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch


@dataclass
class BestRecord:
    """The best evaluation so far by ``checkpoint.best_metric`` and the evaluations since it (early stopping)."""

    value: float | None = None
    step: int | None = None
    evals_since: int = 0
    metrics: dict | None = None

    @classmethod
    def of(cls, saved: dict | None) -> BestRecord:
        saved = saved or {}
        return cls(saved.get("value"), saved.get("step"), int(saved.get("evals_since", 0)), saved.get("metrics"))


@dataclass
class LoopState:
    """Where the loop is and what it carries forward; one object, saved and restored whole."""

    step: int = 0
    epoch: int = 0
    start_step: int = 0  # the global batch of ``epoch`` the loop starts at (a resumed run); 0 from the next epoch on
    running: torch.Tensor | None = None  # the summed loss since the last log, on the device
    running_count: float | torch.Tensor = 0  # the loss units since the last log (a float with class weights; a
    # device scalar when a method counts them after making its batches)
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # step metrics since the last log: [sum, count]
    extra_updates: int = 0  # optimizer steps beyond one per global batch (a method's several updates on one batch)
    method: object | None = None  # the method's resumable state (``Task.step.state``), attached by ``attach_method``
    method_saved: dict | None = None  # its state as a checkpoint held it, until attached
    eval_step: int = -1  # the step of the last evaluation, and its metrics
    last_eval: dict = field(default_factory=dict)
    best: BestRecord = field(default_factory=BestRecord)
    rng: dict | None = None  # the generators a resume restores (``apply_rng``), None on a fresh start
    resumed_from: Path | None = None

    @classmethod
    def fresh(cls, device: torch.device) -> LoopState:
        return cls(running=torch.zeros((), device=device))

    @property
    def batches(self) -> int:
        """The global batches taken: the position in the data (the step, unless a method ran several updates on one)."""
        return self.step - self.extra_updates

    def next_epoch(self) -> None:
        self.epoch += 1
        self.start_step = 0

    def state_dict(self) -> dict:
        """``trainer``: the counters every process shares; ``rank``: this process's generators and running loss."""
        trainer = {"step": self.step, "epoch": self.epoch, "best": asdict(self.best), "eval_step": self.eval_step,
                   "last_eval": self.last_eval}
        if self.extra_updates:
            trainer["extra_updates"] = self.extra_updates
        rank = {"rng": rng_state(), "running_loss": self.running, "running_count": self.running_count}
        if self.metrics:
            rank["step_metrics"] = self.metrics
        if self.method is not None:
            rank["method"] = self.method.state_dict()
        return {"trainer": trainer, "rank": rank}

    def load_state_dict(self, state: dict, steps_per_epoch: int, device: torch.device) -> None:
        """What ``state_dict`` saved (``rank`` may be empty: an allowed inexact resume without this process's file).
        The position is the global batches taken (the step's unless a method ran several updates per batch): epoch
        ``batches // steps_per_epoch``, from its batch ``batches % steps_per_epoch``."""
        trainer, rank = state["trainer"], state.get("rank") or {}
        self.step = int(trainer["step"])
        self.extra_updates = int(trainer.get("extra_updates", 0))
        self.epoch, self.start_step = divmod(self.batches, steps_per_epoch)
        self.best = BestRecord.of(trainer.get("best"))
        self.eval_step = int(trainer.get("eval_step", -1))
        self.last_eval = trainer.get("last_eval") or {}
        self.running = rank.get("running_loss", torch.zeros(())).to(device)
        self.running_count = rank.get("running_count", 0)
        if isinstance(self.running_count, torch.Tensor):
            self.running_count = self.running_count.to(device)
        self.metrics = {k: v.to(device) for k, v in (rank.get("step_metrics") or {}).items()}
        self.method_saved = rank.get("method")
        self.rng = rank.get("rng")

    def attach_method(self, method: object | None) -> None:
        """Hold the method's resumable state (``Task.step.state``: None for most), restored to what the checkpoint
        saved of it, if any."""
        self.method = method
        if method is not None and self.method_saved is not None:
            method.load_state_dict(self.method_saved)

    def apply_rng(self, seed: int, rank: int) -> None:
        """The last thing before the loop: every generator exactly where the checkpoint left it (a resume without
        this process's state: seeded from the step instead)."""
        if self.rng is not None:
            set_rng_state(self.rng)
        elif self.resumed_from is not None:  # allowed inexact resume without this rank's RNG
            from accelerate.utils import set_seed

            set_seed(seed + 1000003 * self.step + rank)


def rng_state() -> dict:
    """Every random number generator this process uses, as tensors and lists of ints (no pickle)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if hasattr(torch, "mps") and torch.backends.mps.is_available():
        state["mps"] = torch.mps.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(tuple(tuple(v) if isinstance(v, list) else v for v in state["python"]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "mps" in state and hasattr(torch, "mps") and torch.backends.mps.is_available():
        torch.mps.set_rng_state(state["mps"])
