"""One builder per ``optim.name``: maintained implementations only (torch, transformers, bitsandbytes, lion-pytorch).

Each builder takes (model, OptimConfig, lr, param_groups) and returns a torch.optim.Optimizer. Optional
libraries are imported here, on use, and a missing one is a UserError that names the extra to install.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from leantrain.config import OptimConfig
from leantrain.errors import UserError
from leantrain.optim.hybrid import CombinedOptimizer

log = logging.getLogger("leantrain")

ADAMW_BETAS = (0.9, 0.999)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def adamw(model, cfg: OptimConfig, lr: float, groups_fn) -> torch.optim.Optimizer:
    """torch AdamW; fused (one kernel for all tensors) where this torch supports the device, else foreach."""
    groups = groups_fn(model, cfg.weight_decay, cfg.decay_norms_and_biases)
    return torch_adamw(groups, cfg, lr, _device(model))


def torch_adamw(groups, cfg: OptimConfig, lr: float, device: torch.device) -> torch.optim.AdamW:
    kwargs = dict(lr=lr, betas=tuple(cfg.betas or ADAMW_BETAS), eps=cfg.eps)
    try:
        return torch.optim.AdamW(groups, fused=device.type in ("cuda", "cpu", "mps", "xpu"), **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, foreach=True, **kwargs)


def adafactor(model, cfg: OptimConfig, lr: float, groups_fn) -> torch.optim.Optimizer:
    """transformers' Adafactor: factored second moment, no first moment (beta1=None), so state is far below AdamW's.

    With a manual learning rate (the default) relative_step and scale_parameter are off, as transformers
    recommends for fine-tuning; ``optim.adafactor_relative_step=true`` turns on its own step size instead.
    """
    from transformers.optimization import Adafactor

    groups = groups_fn(model, cfg.weight_decay, cfg.decay_norms_and_biases)
    if cfg.adafactor_relative_step:
        return Adafactor(groups, lr=None, relative_step=True, scale_parameter=True, warmup_init=True)
    return Adafactor(groups, lr=lr, relative_step=False, scale_parameter=False, warmup_init=False)


def adamw8bit(model, cfg: OptimConfig, lr: float, groups_fn) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW8bit: both moments in 8 bits with block-wise scales (~2 bytes/parameter). Runs on CUDA,
    and on CPU with bitsandbytes >= 0.45's CPU backend (slower than torch's fused AdamW there)."""
    bnb = _import_bitsandbytes()
    groups = groups_fn(model, cfg.weight_decay, cfg.decay_norms_and_biases)
    return bnb.optim.AdamW8bit(groups, lr=lr, betas=tuple(cfg.betas or ADAMW_BETAS), eps=cfg.eps)


def _import_bitsandbytes():
    quiet = logging.getLogger("bitsandbytes")  # its 4-bit CPU matmul probe warns about an unrelated package
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        import bitsandbytes
    except ImportError:
        raise UserError(
            "optim.name=adamw8bit needs bitsandbytes: pip install 'leantrain[8bit]' (CUDA GPUs; x86-64 and ARM CPUs "
            "with bitsandbytes >= 0.45; Apple MPS partly), or choose optim.name=adafactor for a small state"
        ) from None
    finally:
        quiet.setLevel(level)
    return bitsandbytes


def sgd(model, cfg: OptimConfig, lr: float, groups_fn) -> torch.optim.Optimizer:
    """torch SGD with momentum (0.9 unless optim.momentum is set; 0 keeps no state) and optional Nesterov."""
    groups = groups_fn(model, cfg.weight_decay, cfg.decay_norms_and_biases)
    momentum = 0.9 if cfg.momentum is None else cfg.momentum
    nesterov = bool(cfg.nesterov) and momentum > 0
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov)


def lion(model, cfg: OptimConfig, lr: float, groups_fn) -> torch.optim.Optimizer:
    """lion-pytorch's Lion (Chen et al. 2023): sign updates, one momentum buffer (4 bytes/parameter). Its authors
    suggest a learning rate 3-10x smaller and weight decay 3-10x larger than AdamW's."""
    try:
        from lion_pytorch import Lion
    except ImportError:
        raise UserError("optim.name=lion needs lion-pytorch: pip install 'leantrain[lion]'") from None
    groups = groups_fn(model, cfg.weight_decay, cfg.decay_norms_and_biases)
    return Lion(groups, lr=lr, betas=tuple(cfg.betas or (0.9, 0.99)))


def muon(model, cfg: OptimConfig, lr: float, groups_fn) -> torch.optim.Optimizer:
    """torch.optim.Muon on the hidden 2-D weights (Linear layers of the base model), AdamW on everything else
    (embeddings, the task head, norms, biases), as Muon's authors prescribe. Muon's step is scaled to match
    AdamW's update RMS (adjust_lr_fn="match_rms_adamw"), so one train.lr serves both."""
    if not hasattr(torch.optim, "Muon"):
        raise UserError(f"optim.name=muon needs torch >= 2.9 (torch.optim.Muon); this is torch {torch.__version__}")
    hidden = muon_parameters(model)
    ids = {id(p) for p in hidden}

    class _Rest(torch.nn.Module):  # the parameters AdamW gets, through the same decay/no-decay split
        def named_parameters(self, *a, **k):
            return ((n, p) for n, p in model.named_parameters() if id(p) not in ids)

    rest = groups_fn(_Rest(), cfg.weight_decay, cfg.decay_norms_and_biases)
    rest = [g for g in rest if g["params"]]
    momentum = 0.95 if cfg.momentum is None else cfg.momentum
    nesterov = True if cfg.nesterov is None else cfg.nesterov
    parts = [torch.optim.Muon(hidden, lr=lr, weight_decay=cfg.weight_decay, momentum=momentum, nesterov=nesterov,
                              adjust_lr_fn="match_rms_adamw")] if hidden else []
    parts += [torch_adamw(rest, cfg, lr, _device(model))] if rest else []
    return CombinedOptimizer(parts)


def muon_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Weights of the Linear layers inside the base model (not the embeddings, not the task head)."""
    body = getattr(model, "base_model", model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_ids = {id(p) for p in head.parameters()} if head is not None else set()
    return [m.weight for m in body.modules()
            if isinstance(m, torch.nn.Linear) and m.weight.requires_grad and id(m.weight) not in head_ids]


BUILDERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": adamw, "adafactor": adafactor, "adamw8bit": adamw8bit, "sgd": sgd, "lion": lion, "muon": muon,
}
