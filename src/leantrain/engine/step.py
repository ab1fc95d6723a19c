"""The training step, the heart of the engine.

step = micro-batches -> forward -> the task's per-unit losses, summed / global count -> backward -> clip -> step.

The task (``leantrain.modeling.tasks``) runs the forward of a micro-batch and gives its loss sum
(``Task.forward_loss``), and says what a unit is (an example, a label, a token); the denominator is the number of units in the *global* batch (all micro-batches, all processes),
known on the host from the batch, so no collective and no host sync is needed to normalise. DDP averages
gradients over processes, so each process scales its loss by the world size: the all-reduced gradient is then
exactly d(sum of losses / global count). Gradients are all-reduced once, on the last micro-batch.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from accelerate import Accelerator
from torch import nn
from torch.profiler import record_function

from leantrain.engine.distributed import clip_gradients, grad_sync
from leantrain.modeling.tasks import Task


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step over this process's micro-batches. Returns this process's loss sum (a device tensor,
    not yet divided by anything) and the gradient norm before clipping (a tensor, or None). No host sync.
    ``global_count``: the task's units (``task.count``) in the global batch, the loss's denominator; ``task``: whose
    ``forward_loss`` runs each micro-batch.
    ``guard(loss_sum, grad_norm)`` (optional): the non-finite check, on the device, between the clip and the update.
    ``on_phase(name)`` (optional) is called when the compute and the optimizer phases end, for timing."""
    micro_batches = list(micro_batches)
    scale = accelerator.num_processes / global_count
    loss_sum = torch.zeros((), device=accelerator.device)
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with grad_sync(model, accelerator, enabled=last):
            with record_function("forward"):
                loss, _ = task.forward_loss(model, batch)
            with record_function("backward"):
                accelerator.backward(loss * scale)
        loss_sum += loss.detach()
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
