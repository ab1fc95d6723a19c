"""Optimizer and learning-rate schedule registry; optimizer-state accounting.

``optim.name`` picks a builder in ``leantrain.optim.builders``; every builder receives the same parameter groups
(no weight decay on biases and normalisation weights unless ``optim.decay_norms_and_biases``). The scheduler is
stepped once per optimizer step, never per micro-batch.
"""

from __future__ import annotations

import functools
import logging
import math

import torch

from leantrain.config import OptimConfig
from leantrain.optim.builders import BUILDERS
from leantrain.optim.state import state_bytes, state_report

__all__ = ["build_optimizer", "build_scheduler", "fused_torch_optimizer", "param_groups", "warmup_steps", "state_bytes",
           "state_report"]

log = logging.getLogger("leantrain")


def param_groups(model: torch.nn.Module, weight_decay: float, decay_all: bool = False,
                 head: tuple = (), head_lr: float | None = None) -> list[dict]:
    """Decay matrices; leave biases and LayerNorm/RMSNorm weights (any parameter with ndim < 2) undecayed. With
    ``head_lr``, the parameters in ``head`` (a new classifier head: ``leantrain.modeling.head_start``) get their own
    groups at that peak learning rate (the schedule scales it as it scales the others)."""
    in_head = {id(p) for p in head} if head_lr is not None else set()
    groups = []
    for fast in (False, True):
        decay, no_decay = [], []
        for _, p in model.named_parameters():
            if p.requires_grad and (id(p) in in_head) == fast:
                (decay if decay_all or p.ndim >= 2 else no_decay).append(p)
        extra = {"lr": head_lr} if fast else {}
        if decay or not fast:
            groups.append({"params": decay, "weight_decay": weight_decay, **extra})
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0, **extra})
    return groups


def fused_torch_optimizer(optimizer) -> torch.optim.Optimizer | None:
    """The torch optimizer under Accelerate's (and leantrain's) wrappers when it is one fused kernel that takes
    GradScaler's ``grad_scale`` / ``found_inf`` inputs (torch AdamW, Adam, SGD with fused=True); else None."""
    torch_opt = getattr(optimizer, "optimizer", optimizer)
    fused = getattr(torch_opt, "defaults", {}).get("fused") and getattr(torch_opt, "_step_supports_amp_scaling", False)
    return torch_opt if fused else None


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, lr: float, head: tuple = (),
                    head_lr: float | None = None) -> torch.optim.Optimizer:
    """The optimizer named by ``cfg.name`` over ``model``'s trainable parameters, peak learning rate ``lr``
    (``head_lr`` for the parameters in ``head``, when given)."""
    groups = functools.partial(param_groups, head=tuple(head), head_lr=head_lr) if head_lr is not None else param_groups
    return BUILDERS[cfg.name](model, cfg, lr, groups)


def warmup_steps(cfg: OptimConfig, total_steps: int) -> int:
    if cfg.warmup_steps is not None:
        return min(cfg.warmup_steps, total_steps)
    return math.ceil(cfg.warmup_ratio * total_steps)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int):
    """One scheduler step per optimizer step (never per micro-batch). linear / cosine decay to 0 after warm-up;
    constant after warm-up; inverse_sqrt: lr x sqrt(warm-up / step) after warm-up (transformers' definitions, written
    here: importing ``transformers.optimization`` imports peft and through it bitsandbytes, whose CPU kernel probe
    prints an unrelated error into every run)."""
    if cfg.name == "adafactor" and cfg.adafactor_relative_step:
        from transformers.optimization import AdafactorSchedule  # the run asked for Adafactor: transformers' own

        log.info("optim.adafactor_relative_step: Adafactor sets its own step size; optim.scheduler and train.lr unused")
        return AdafactorSchedule(optimizer)
    factor = functools.partial(lr_factor, cfg.scheduler, warmup_steps(cfg, total_steps), total_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def lr_factor(kind: str, warmup: int, total: int, step: int) -> float:
    """The learning rate's multiplier at ``step``: linear warm-up over ``warmup`` steps, then ``kind``
    (transformers' definitions, as its floating-point expressions: after the warm-up the rate is bitwise the Trainer's,
    tested). Warm-up step s runs at (s + 1) / (warmup + 1) of the peak (transformers': s / warmup, so its step 0 runs
    at lr 0 and ``train.max_steps=1`` trains nothing)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if kind == "constant":
        return 1.0
    if kind == "inverse_sqrt":  # transformers' timescale: the warm-up (1 without one)
        timescale = max(warmup, 1)
        return 1.0 / math.sqrt((step + timescale - warmup) / timescale)
    if kind == "cosine":
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return max(0.0, (total - step) / max(1, total - warmup))  # linear (1 - progress differs in the last bit)
