"""Optimizer and learning-rate schedule. Parameter groups: no weight decay on biases and normalisation weights."""

from __future__ import annotations

import math

import torch

from leantrain.config import OptimConfig


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices; leave biases and LayerNorm/RMSNorm weights (any parameter with ndim < 2) undecayed."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, lr: float) -> torch.optim.Optimizer:
    """AdamW; fused on CUDA/CPU where this torch supports it (one kernel for all tensors), else foreach."""
    groups = param_groups(model, cfg.weight_decay)
    device = next(model.parameters()).device
    kwargs = dict(lr=lr, betas=tuple(cfg.betas), eps=cfg.eps)
    try:
        return torch.optim.AdamW(groups, fused=device.type in ("cuda", "cpu", "mps", "xpu"), **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, foreach=True, **kwargs)


def warmup_steps(cfg: OptimConfig, total_steps: int) -> int:
    if cfg.warmup_steps is not None:
        return min(cfg.warmup_steps, total_steps)
    return math.ceil(cfg.warmup_ratio * total_steps)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int):
    """One scheduler step per optimizer step (never per micro-batch)."""
    from transformers import get_scheduler

    name = {"constant": "constant_with_warmup"}.get(cfg.scheduler, cfg.scheduler)
    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps(cfg, total_steps), num_training_steps=total_steps)
