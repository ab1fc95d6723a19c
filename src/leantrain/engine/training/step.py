"""The training step, the heart of the engine.

step = micro-batches -> the method's loss -> (loss sum, step metrics) -> / global count -> backward -> clip -> step.

The method (a task, ``leantrain.methods``) runs the forward of a micro-batch and gives its loss sum and its
step metrics (``Task.step.loss``), and says what a unit is (an example, a label, a token); the denominator is the
number of units in the *global* batch (all micro-batches, all processes): known on the host from the batch, so that
no collective and no host sync is needed to normalise, or a device scalar a method counted after making its batches
(``Task.step.batches``), summed over the processes once (``global_count``). DDP averages gradients over processes, so
each process scales its loss by the world size: the all-reduced gradient is then exactly d(sum of losses / global
count). Gradients are all-reduced once, on the last micro-batch.

Step metrics are ``{name: (sum, count)}`` pairs of device tensors, added on the device over micro-batches and steps
(``add_step_metrics``) and reduced over the processes only on a logging step, in one collective
(``step_metric_means``).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
from accelerate import Accelerator
from torch import nn
from torch.profiler import record_function

from leantrain.engine.devices.distributed import clip_gradients, grad_sync
from leantrain.methods import Task
from leantrain.methods.seam import PEAK


def train_step(
    model: nn.Module,
    micro_batches: Iterable[dict[str, torch.Tensor]],
    *,
    global_count: float,
    task: Task,
    accelerator: Accelerator,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float | None,
    guard: Callable[[torch.Tensor, torch.Tensor | None], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    metrics: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step over this process's micro-batches. Returns this process's loss sum (a device tensor,
    not yet divided by anything) and the gradient norm before clipping (a tensor, or None). No host sync.
    ``global_count``: the task's units in the global batch, the loss's denominator (a host number, or a device scalar
    already summed over the processes); ``task``: whose ``loss`` runs each micro-batch. ``metrics`` (optional): the
    running step metrics the micro-batches' own are added into, on the device (``add_step_metrics``).
    ``guard(loss_sum, grad_norm)`` (optional): the non-finite check, on the device, between the clip and the update.
    ``on_phase(name)`` (optional) is called when the compute and the optimizer phases end, for timing."""
    micro_batches = list(micro_batches)
    scale = accelerator.num_processes / global_count
    loss_sum = torch.zeros((), device=accelerator.device)
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with grad_sync(model, accelerator, enabled=last):
            with record_function("forward"):
                loss, step_metrics = task.step.loss(model, batch)
            with record_function("backward"):
                accelerator.backward(loss * scale)
        loss_sum += loss.detach()
        if metrics is not None:
            add_step_metrics(metrics, step_metrics)
    if on_phase is not None:
        on_phase("compute")
    with record_function("optimizer"):
        grad_norm = clip_gradients(model, accelerator, max_grad_norm, optimizer) if max_grad_norm is not None else None
        if guard is not None:
            guard(loss_sum, grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    if on_phase is not None:
        on_phase("optimizer")
    return loss_sum, grad_norm


def global_count(count: float | torch.Tensor, accelerator: Accelerator) -> float | torch.Tensor:
    """The loss's denominator over all processes: a host count is already global; a device scalar (this process's
    units, counted by a method after making its batches) is summed over the processes, on the device."""
    return global_counts(count, None, accelerator)[0]


def global_counts(count: float | torch.Tensor, tokens: float | torch.Tensor | None,
                  accelerator: Accelerator) -> tuple:
    """(count, tokens) over all processes, in one collective: a method's per-process values (``StepBatches``: the
    loss's device count, the tokens tokens/s credits) summed; a host ``count`` is global already and stays a host
    number; ``tokens`` comes back as a host int (None stays None)."""
    local = isinstance(count, torch.Tensor)
    if not local and tokens is None:
        return count, None
    values = [count if local else 0.0, 0.0 if tokens is None else tokens]
    stacked = torch.stack([torch.as_tensor(v, dtype=torch.float32, device=accelerator.device).detach().reshape(())
                           for v in values])
    summed = accelerator.reduce(stacked, reduction="sum") if accelerator.num_processes > 1 else stacked
    return (summed[0] if local else count), (None if tokens is None else int(round(float(summed[1]))))


def add_step_metrics(into: dict[str, torch.Tensor], metrics: dict[str, tuple]) -> None:
    """Add a micro-batch's step metrics ``{name: (sum, count)}`` (``sum`` a device tensor, ``count`` a tensor or a
    number) into the running ``{name: tensor([sum, count])}``, on the device; a peak (a name ending in
    ``seam.PEAK``) keeps the larger value instead of the sum."""
    for name, (total, count) in metrics.items():
        total = total.detach().float().reshape(())
        pair = torch.stack([total, torch.as_tensor(count, dtype=torch.float32, device=total.device).reshape(())])
        if name not in into:
            into[name] = pair
        elif name.endswith(PEAK):
            into[name] = torch.stack([torch.maximum(into[name][0], pair[0]), into[name][1] + pair[1]])
        else:
            into[name] = into[name] + pair


def step_metric_means(running: dict[str, torch.Tensor], accelerator: Accelerator) -> dict[str, float]:
    """``{name: sum / count}`` of the running step metrics over every process (NaN for a count of 0), a peak's largest
    value: one collective for the sums (stacked), one more for the peaks when there are any, and one host sync; on
    logging steps only."""
    if not running:
        return {}
    names = sorted(running)  # the same order on every process
    stacked = torch.stack([running[n] for n in names])
    totals = accelerator.reduce(stacked, reduction="sum").tolist()
    out = {n: total / count if count else float("nan") for n, (total, count) in zip(names, totals)}
    peaks = [i for i, n in enumerate(names) if n.endswith(PEAK)]
    if peaks:  # a process that saw none holds -inf, never the maximum
        seen = torch.where(stacked[peaks, 1] > 0, stacked[peaks, 0], torch.full_like(stacked[peaks, 0], -math.inf))
        for i, value in zip(peaks, accelerator.reduce(seen, reduction="max").tolist()):
            out[names[i]] = value if totals[i][1] else float("nan")
    return out