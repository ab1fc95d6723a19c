"""What a checkpoint of a run with a frozen base holds (LoRA, QLoRA): the trainable tensors (adapters, a classifier's
head), the module buffers that are saved with a model (BatchNorm's running statistics move even in a frozen base),
and the base's identity. The base itself is rebuilt from its pretrained weights (or from its config and
``train.seed``) on resume, as at the start of the run, so the checkpoint is the adapter's size, not the model's, and
a resume is bitwise the uninterrupted run (tests/integration/test_lora_train.py kills and resumes one).

The identity (``model.safetensors`` metadata) is the base's name and a fingerprint of its frozen tensors (names,
shapes, dtypes and their first values): resuming over another base (a local folder overwritten since) is refused
instead of continuing silently on other weights."""

from __future__ import annotations

import hashlib

import torch
from torch import nn

CHECKPOINT_KIND = "trainable-only"  # model.safetensors metadata: the checkpoint holds the trainable state only
FINGERPRINT_VALUES = 4096  # leading values of each frozen tensor in the fingerprint (cheap, and any re-save differs)


def saves_trainable_only(model: nn.Module) -> bool:
    """Whether checkpoints of ``model`` hold its trainable state only: a peft model (LoRA, QLoRA) over a frozen
    base (duck-typed: no import of peft for runs without it)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _saved_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """The buffers ``state_dict`` would hold (persistent ones), by full name."""
    out = {}
    for prefix, module in model.named_modules():
        for name, buf in module._buffers.items():
            if buf is not None and name not in module._non_persistent_buffers_set:
                out[f"{prefix}.{name}" if prefix else name] = buf
    return out


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable tensors and the saved buffers (contiguous copies)."""
    state = {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    state.update({n: b.detach().contiguous() for n, b in _saved_buffers(model).items()})
    return state


def load_trainable_state(model: nn.Module, tensors: dict) -> tuple[list[str], list[str]]:
    """Copy a ``trainable_state`` back into ``model``; returns (missing trainable names, unexpected names)."""
    params = dict(model.named_parameters())
    wanted = {n: p for n, p in params.items() if p.requires_grad}
    wanted.update(_saved_buffers(model))
    with torch.no_grad():
        for name, value in tensors.items():
            if name in wanted:
                wanted[name].copy_(value)
    return sorted(set(wanted) - set(tensors)), sorted(set(tensors) - set(wanted))


def base_fingerprint(model: nn.Module) -> str:
    """sha256 over the frozen parameters' names, shapes, dtypes and first FINGERPRINT_VALUES values."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        if p.requires_grad:
            continue
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
        head = p.detach().reshape(-1)[:FINGERPRINT_VALUES].cpu().contiguous()
        h.update(head.view(torch.uint8).numpy().tobytes() if head.numel() else b"")
    return h.hexdigest()


def identity(model: nn.Module, base_name: str) -> dict[str, str]:
    """The safetensors metadata of a trainable-only checkpoint."""
    return {"leantrain": CHECKPOINT_KIND, "base": base_name, "base_fingerprint": base_fingerprint(model)}
