"""Fast dropout for CPU training (``efficiency.dropout``).

torch's CPU dropout draws one Mersenne-Twister number per element through ``bernoulli_``: on the default job
(MiniLM, batch 32, ~14 tokens) its 20 calls per step took ~8% of the step. ``FastDropout`` draws 64-bit words
from the same generator and reads each as four 16-bit uniforms, so one draw covers four elements; an element is
kept when its uniform is at or above ``round(p * 65536)``. The drop rate is therefore p rounded to 1/65536 (0.1
becomes 0.1000061) and kept elements are scaled by ``1 / (1 - that rate)``, so the expectation is exactly the
input, as with ``nn.Dropout``. Masks come from torch's default generator: seeded by ``train.seed``, saved in
checkpoints, and so a resumed run is bitwise the same. In eval mode (or with p = 0) it is the identity.

Only ``nn.Dropout`` modules are swapped; dropout inside attention kernels (SDPA) stays torch's. On CUDA torch
already uses a counter-based generator that is fast, so ``auto`` keeps torch's dropout there.
"""

from __future__ import annotations

import torch
from torch import nn

LEVELS = 1 << 16  # the masks' resolution: p is rounded to a multiple of 1 / LEVELS


def quantized_p(p: float) -> float:
    """The drop rate FastDropout actually applies for a requested ``p``."""
    return round(p * LEVELS) / LEVELS


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """A boolean mask, True with probability ``1 - quantized_p(p)``: 16 random bits per element, 4 per draw."""
    n = shape.numel()
    words = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=device)
    bits = words.view(torch.int16)[:n].view(shape)  # uniform on [-32768, 32767]
    return bits >= round(p * LEVELS) - LEVELS // 2


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep = keep_mask(x.shape, p, x.device)
        scale = 1.0 / (1.0 - quantized_p(p))
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x * scale, 0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad * ctx.scale, 0), None


class FastDropout(nn.Dropout):
    """``nn.Dropout`` with masks drawn four elements per random word (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if quantized_p(self.p) >= 1.0:
            return x * 0.0
        return _Dropout.apply(x, self.p)


def resolve_dropout(requested: str, device_type: str) -> str:
    """``auto`` -> ``fast`` on CPU, ``torch`` on GPUs (their dropout is already cheap)."""
    if requested == "auto":
        return "fast" if device_type == "cpu" else "torch"
    return requested


def disable_dropout(model: nn.Module) -> int:
    """Set every ``nn.Dropout`` of ``model`` (LoRA's branch dropout included) to p = 0, as TRL's
    ``disable_dropout``; returns how many had p > 0. The dropout a transformers attention passes to SDPA is its
    ``nn.Dropout``'s p, so that goes too. The model's config (what it saves) is unchanged."""
    changed = 0
    for module in model.modules():
        if isinstance(module, nn.Dropout) and module.p > 0:
            module.p = 0.0
            changed += 1
    return changed


def use_fast_dropout(model: nn.Module) -> int:
    """Replace every plain ``nn.Dropout`` of p > 0 in ``model`` by a ``FastDropout`` of the same p; returns how
    many. One at p = 0 (:func:`disable_dropout`) drops nothing and stays as it is. Dropout modules hold no
    parameters or buffers, so state_dict keys and save_pretrained are unchanged."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout and child.p > 0:
                setattr(parent, name, FastDropout(child.p, child.inplace).train(child.training))
                swapped += 1
    return swapped
