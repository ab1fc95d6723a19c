"""Per-token losses of a causal LM (placeholder of the plain path; the chunked path is the lmperf branch's).

``per_token_losses(outputs, labels)``: the cross-entropy of each shifted target, ``[B, T-1]`` in fp32, 0 where the
target is -100 (position i predicts labels[i + 1])."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100


def per_token_losses(outputs, labels: torch.Tensor) -> torch.Tensor:
    """``[B, T-1]`` fp32 cross-entropy of the shifted targets from ``outputs.logits`` (``[B, T, V]``)."""
    logits = outputs.logits
    b, t = labels.shape
    shifted = logits[:, :-1, :].float().reshape(-1, logits.shape[-1])
    targets = labels[:, 1:].reshape(-1)
    return F.cross_entropy(shifted, targets, ignore_index=IGNORE, reduction="none").view(b, t - 1)
