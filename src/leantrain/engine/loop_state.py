"""The loop's one state: what changes from step to step and what a checkpoint must hold to continue the run exactly.

The model, the optimizer and the schedule keep their own state; everything else the loop moves forward lives in one
``LoopState``, owned by the loop: the position (step, epoch, the first batch of the epoch a resumed run starts at),
the loss accumulated on the device since the last log, the last evaluation, the best-model record and the random
generators. ``state_dict()`` is what the checkpoint writes (``trainer``: shared by every process, written by rank 0
into ``trainer_state``; ``rank``: each process's own RNG and running loss, in ``rank-<r>``) and ``load_state_dict()``
what a resume reads back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from leantrain.engine.checkpoint.save import rng_state, set_rng_state


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
    running_count: float = 0  # the loss units since the last log (a float with class weights)
    eval_step: int = -1  # the step of the last evaluation, and its metrics
    last_eval: dict = field(default_factory=dict)
    best: BestRecord = field(default_factory=BestRecord)
    rng: dict | None = None  # the generators a resume restores (``apply_rng``), None on a fresh start
    resumed_from: Path | None = None

    @classmethod
    def fresh(cls, device: torch.device) -> LoopState:
        return cls(running=torch.zeros((), device=device))

    def next_epoch(self) -> None:
        self.epoch += 1
        self.start_step = 0

    def state_dict(self) -> dict:
        """``trainer``: the counters every process shares; ``rank``: this process's generators and running loss."""
        trainer = {"step": self.step, "epoch": self.epoch, "best": asdict(self.best), "eval_step": self.eval_step,
                   "last_eval": self.last_eval}
        return {"trainer": trainer,
                "rank": {"rng": rng_state(), "running_loss": self.running, "running_count": self.running_count}}

    def load_state_dict(self, state: dict, steps_per_epoch: int, device: torch.device) -> None:
        """What ``state_dict`` saved (``rank`` may be empty: an allowed inexact resume without this process's file).
        The position is the step's: epoch ``step // steps_per_epoch``, from its batch ``step % steps_per_epoch``."""
        trainer, rank = state["trainer"], state.get("rank") or {}
        self.step = int(trainer["step"])
        self.epoch, self.start_step = divmod(self.step, steps_per_epoch)
        self.best = BestRecord.of(trainer.get("best"))
        self.eval_step = int(trainer.get("eval_step", -1))
        self.last_eval = trainer.get("last_eval") or {}
        self.running = rank.get("running_loss", torch.zeros(())).to(device)
        self.running_count = rank.get("running_count", 0)
        self.rng = rank.get("rng")

    def apply_rng(self, seed: int, rank: int) -> None:
        """The last thing before the loop: every generator exactly where the checkpoint left it (a resume without
        this process's state: seeded from the step instead)."""
        if self.rng is not None:
            set_rng_state(self.rng)
        elif self.resumed_from is not None:  # allowed inexact resume without this rank's RNG
            from accelerate.utils import set_seed

            set_seed(seed + 1000003 * self.step + rank)
