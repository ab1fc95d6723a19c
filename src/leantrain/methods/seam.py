"""The method seam of the training step: what a method (a task) hands the engine at the start of each global step,
and what it returns beside its loss.

- ``Task.step.batches(ctx, micro_batches, count) -> StepBatches``: called at the start of each global step with this
  process's micro-batches as loaded (on the device) and the loss's denominator counted on the host (global: all
  micro-batches, all processes). By default they go on unchanged, with one update. A method may make its own (e.g.
  generate with ``ctx.model`` under no_grad), give a ``count`` that is a device scalar (this process's units: the
  engine sums it over the processes with one all-reduce and divides by that), and ask for several optimizer updates
  on them (``updates``: each one optimizer and one scheduler step; the loop takes them all in one iteration, so a
  checkpoint never falls inside them). It may also give the ``tokens`` tokens/s credits for the step (this process's,
  a host number or a device scalar, summed over the processes with the count: e.g. the prompt and completion tokens
  of a rollout; unset: the loaded rows' count, ``Task.data.throughput_tokens``) and ``samples``, a few JSON-able records of
  what it made (e.g. generated completions), or a callable making them (decoding them reads the device: the engine
  calls it only where it writes them, ``completions.jsonl`` on the main process at logging steps).
- Loaded micro-batches may carry non-tensor entries (e.g. a prompt batch's texts and reward columns, as lists): they
  reach ``step.batches`` as they are; only the tensors are moved to the device.
- ``Task.step.loss(model, batch) -> (loss_sum, step_metrics)``: ``step_metrics`` is ``{name: (sum, count)}`` of device
  tensors (the same names at every call), so that the mean over micro-batches, steps and processes is exact: the
  engine adds them on the device and logs ``sum / count`` under ``name`` at each logging step. A name ending in
  ``PEAK`` (``_max``) is a peak instead: ``(value, count)``, the largest value kept over micro-batches, steps and
  processes, logged as it is (NaN when no count).
- ``Task.step.state(seed, rank)``: what the method must carry across a resume (e.g. its sampling generator), an object
  with ``state_dict()`` / ``load_state_dict()`` kept in the loop's state, checkpointed per process, handed back to it
  as ``ctx.state``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

PEAK = "_max"  # a step metric whose name ends so is the largest value seen, not a mean


@dataclass(frozen=True)
class StepContext:
    """What ``Task.step.batches`` may use: the model being trained (as placed: DDP-wrapped on several processes), the
    Accelerator, the optimizer steps done so far, the method's own resumable state (``Task.step.state``, or None),
    and ``generating``: None, or a callable a method that generates calls once its generation has begun (the
    engine's fault injection: a signal that lands during a generation)."""

    model: Any
    accelerator: Any
    step: int
    state: Any = None
    lap: Any = None  # lap(phase, synced=False): the time since the last lap counted to ``phase`` (the step's time
    # split: generation, scoring...); where the device runs apart from the host only a phase that ended with a host
    # read (``synced``) is counted. None: not measured
    generating: Any = None


@dataclass(frozen=True)
class StepBatches:
    """The micro-batches one global step trains on, the loss's denominator (a host number: the global count; or a
    device scalar: this process's count, summed over the processes by the engine), the optimizer updates to run on
    them, the tokens tokens/s credits (this process's; None: the loaded rows' count) and sample records of what the
    method made (``completions.jsonl``, main process, at logging steps)."""

    micro_batches: list[dict]
    count: Any
    updates: int = 1
    tokens: Any = None
    samples: tuple | list | Callable[[], list] = ()
