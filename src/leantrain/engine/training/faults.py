"""Fault injection, all of it in one place: environment variables that make a run fail on purpose, to check that a
failing process stops the whole run (on a laptop or a cluster), that resume survives a dying machine, and that a
NaN is caught. Read once when the run starts; unset, each costs one comparison per step.

``LEANTRAIN_FAULT=KIND@STEP[:RANK]``  process RANK (default 0) fails when it reaches optimizer step STEP: ``raise``
                                       raises an exception, ``kill`` sends itself SIGKILL.
``LEANTRAIN_TEST_NAN_AT_STEP=k``       the loss of optimizer step k becomes NaN (and so its gradients).
``LEANTRAIN_TEST_KILL_AT_STEP=k``      SIGKILL this process right after step k (and its checkpoint save, if any).
``LEANTRAIN_TEST_CRASH_IN_SAVE=k``     die half-way through the checkpoint save of step k (files written, no manifest).
``LEANTRAIN_TEST_CRASH_IN_FINAL_SAVE=1``  die half-way through the final save of model/ (weights written, not the
                                       run settings).
``LEANTRAIN_TEST_SIGNAL_AT_STEP=SIG@k[:RANK]``  process RANK (default 0) sends itself SIG (TERM, INT) after step k,
                                       as a scheduler preempting the job would (see ``engine.checkpoint.preempt``).
``LEANTRAIN_TEST_SIGNAL_IN_GENERATION=SIG@k[:RANK]``  the same, from inside the generation of step k of an online
                                       method (GRPO: at the first forward of its first rollout), the step in flight.
"""

from __future__ import annotations

import os
import signal

FAULT = "LEANTRAIN_FAULT"
NAN_AT_STEP = "LEANTRAIN_TEST_NAN_AT_STEP"
KILL_AT_STEP = "LEANTRAIN_TEST_KILL_AT_STEP"
CRASH_IN_SAVE = "LEANTRAIN_TEST_CRASH_IN_SAVE"
CRASH_IN_FINAL_SAVE = "LEANTRAIN_TEST_CRASH_IN_FINAL_SAVE"
SIGNAL_AT_STEP = "LEANTRAIN_TEST_SIGNAL_AT_STEP"
SIGNAL_IN_GENERATION = "LEANTRAIN_TEST_SIGNAL_IN_GENERATION"


def parse(spec: str | None) -> tuple[str, int, int] | None:
    if not spec:
        return None
    try:
        kind, rest = spec.split("@", 1)
        step, _, rank = rest.partition(":")
        if kind not in ("raise", "kill"):
            raise ValueError
        return kind, int(step), int(rank or 0)
    except ValueError:
        raise ValueError(f"{FAULT}={spec!r}: expected KIND@STEP[:RANK] with KIND raise or kill") from None


def _step_of(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value and value.lstrip("-").isdigit() else None


def _signal_of(spec: str | None, rank: int) -> tuple[int, int] | None:
    """(signal number, step) of ``LEANTRAIN_TEST_SIGNAL_AT_STEP=SIG@k[:RANK]`` for this rank, else None."""
    if not spec:
        return None
    name, _, rest = spec.partition("@")
    step, _, who = rest.partition(":")
    if int(who or 0) != rank:
        return None
    return int(getattr(signal, f"SIG{name}")), int(step)


class FaultInjector:
    """The faults this process was asked for, each tied to the point of the run where it strikes."""

    def __init__(self, rank: int):
        fault = parse(os.environ.get(FAULT))
        self.fault = fault if fault and fault[2] == rank else None
        self.nan_at = _step_of(NAN_AT_STEP)
        self.kill_at = _step_of(KILL_AT_STEP)
        self.crash_in_save_at = _step_of(CRASH_IN_SAVE)
        self.crash_in_final_save = _step_of(CRASH_IN_FINAL_SAVE) == 1
        self.signal_at = _signal_of(os.environ.get(SIGNAL_AT_STEP), rank)
        self.signal_in_generation = _signal_of(os.environ.get(SIGNAL_IN_GENERATION), rank)

    def poison(self, micro_batches: list[dict], step: int) -> list[dict]:
        """Before optimizer step ``step``: its loss becomes NaN (``LEANTRAIN_TEST_NAN_AT_STEP``)."""
        if self.nan_at == step:
            micro_batches[0]["loss_weight"] = micro_batches[0]["loss_weight"] * float("nan")
        return micro_batches

    def after_update(self, step: int) -> None:
        """Right after the update of step ``step``: ``LEANTRAIN_FAULT``."""
        if self.fault is None or step != self.fault[1]:
            return
        if self.fault[0] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected fault at step {step} ({FAULT})")

    def in_save(self, step: int) -> None:
        """Half-way through the checkpoint save of step ``step``: ``LEANTRAIN_TEST_CRASH_IN_SAVE``."""
        if self.crash_in_save_at == step:
            os._exit(137)

    def in_final_save(self) -> None:
        """Half-way through the final save of model/: ``LEANTRAIN_TEST_CRASH_IN_FINAL_SAVE``."""
        if self.crash_in_final_save:
            os._exit(137)

    def after_step(self, step: int) -> None:
        """After everything step ``step`` does (log, eval, save): ``LEANTRAIN_TEST_KILL_AT_STEP``."""
        if self.kill_at == step:
            os.kill(os.getpid(), signal.SIGKILL)

    def signal_after(self, step: int) -> None:
        """After step ``step``, before the processes agree whether to stop: ``LEANTRAIN_TEST_SIGNAL_AT_STEP``."""
        if self.signal_at is not None and step == self.signal_at[1]:
            os.kill(os.getpid(), self.signal_at[0])

    def in_generation(self, step: int):  # noqa: ANN201 - a callable or None
        """What a method calls once the generation of step ``step`` has begun (``StepContext.generating``): sends
        ``LEANTRAIN_TEST_SIGNAL_IN_GENERATION``'s signal at that step; None (nothing to call) at every other."""
        if self.signal_in_generation is None or step != self.signal_in_generation[1]:
            return None
        return lambda: os.kill(os.getpid(), self.signal_in_generation[0])
