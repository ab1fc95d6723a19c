"""The model inside its wrappers: DDP, FSDP1 and DeepSpeed hold it as ``.module``, torch.compile as ``._orig_mod``.
The one unwrap of ``modeling`` and the methods (peft's model is not a wrapper here: its adapters are the model)."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

MAX_DEPTH = 8  # wrappers around wrappers (compile of DDP of ...): a cycle of attributes never loops forever


def unwrapped(model: nn.Module) -> nn.Module:
    """The innermost model under ``.module`` / ``._orig_mod`` wrappers (``model`` itself when unwrapped)."""
    for _ in range(MAX_DEPTH):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner
    return model


@contextmanager
def frozen_forward(model):
    """No gradients, eval mode (no dropout, no random draws), the mode restored after."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was)
