"""A causal LM's per-token losses: the one call every method makes (causal LM, the preference losses, KTO, GRPO,
their evaluation and the memory model's calibration), whichever output layer the run chose.

``token_losses(model, forward, labels)`` runs ``forward()`` (the method's forward of ``model``, through whatever wraps
it) and returns :class:`TokenLosses`: each target's fp32 cross-entropy (minus its log-prob; 0 where the target is
-100) and, when asked, each position's entropy:

- plain (``efficiency.chunked_loss`` off, or auto's plain logits): from the forward's ``[B, T, V]`` logits, their fp32
  log-softmax (:func:`logit_losses`, :func:`target_losses`);
- the chunked loss or Liger's fused kernel (``leantrain.modeling.chunked_loss.install_chunked_loss``): the forward
  runs up to the output layer, whose input is taken (``chunked_loss.final_hidden``: the layer computes nothing), then
  the installed kernel computes the losses from it and the layer's weight, in the dtype the forward's autocast gave
  the layer: :class:`~leantrain.modeling.chunked_loss.ChunkedCrossEntropy` a chunk of tokens at a time (the entropy
  too, from each chunk's log-softmax), or Liger's kernel (``leantrain.modeling.output_loss``; no entropy: None); no
  ``tokens x vocab`` logits.

The targets: ``next_token=True`` (a causal LM's batch): ``labels [B, T]`` as the model's inputs, position i
predicting ``labels[:, i + 1]``, losses ``[B, T-1]``; ``next_token=False``: ``labels [B, T]`` aligned with the
forward's positions, position i predicting ``labels[:, i]`` (GRPO's completions after their prompt's last token),
losses ``[B, T]``. ``row_weights [B]`` (optional): each row's ``loss_weight``; Liger's kernel gets the targets of rows
of weight 0 masked (their incoming gradient must equal the others': ``output_loss``), the others need nothing of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from leantrain.modeling.chunked_loss import (IGNORE, KERNEL, chunk_tokens_of, chunked_layer, chunked_token_losses,
                                             final_hidden)
from leantrain.modeling.output_loss import liger_token_losses


class TokenLosses(NamedTuple):
    """Per-token losses (fp32, minus each target's log-prob, 0 where it is -100) and each position's entropy (fp32,
    no gradient; None unless asked, and from Liger's kernel)."""

    losses: torch.Tensor
    entropy: torch.Tensor | None = None


def token_losses(model: nn.Module, forward: Callable[[], object], labels: torch.Tensor, *, next_token: bool = True,
                 entropy: bool = False, row_weights: torch.Tensor | None = None) -> TokenLosses:
    """The per-token losses of ``forward()``, a forward of ``model``, for ``labels`` (module doc: ``next_token``,
    ``row_weights``); through the output loss installed on ``model``, else from the forward's logits."""
    layer = chunked_layer(model)
    if layer is None:
        logits = forward().logits
        return TokenLosses(*(logit_losses if next_token else target_losses)(logits, labels, entropy))
    hidden = final_hidden(model, forward)
    states, targets = (hidden.states[:, :-1], labels[:, 1:]) if next_token else (hidden.states, labels)
    return kernel_losses(layer, states, targets, hidden.dtype, row_weights, entropy)


def kernel_losses(layer: nn.Module, states: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype,
                  row_weights: torch.Tensor | None = None, entropy: bool = False) -> TokenLosses:
    """Per-token losses ``[B, T]`` (fp32) of the installed output ``layer`` on ``states [B, T, H]`` against
    ``targets [B, T]`` (position i predicts ``targets[:, i]``), its matmul in ``dtype``: the chunked loss (with
    ``entropy``, each position's), or Liger's kernel with the targets of rows of weight 0 masked (no entropy)."""
    b, t = targets.shape
    if states.shape[:2] != (b, t):
        raise ValueError(f"output loss: targets {(b, t)} do not match the hidden states {tuple(states.shape[:2])}")
    flat = states.reshape(-1, states.shape[-1])
    if getattr(layer, KERNEL) == "liger":
        if row_weights is not None and row_weights.shape == (b,):  # no sync: a where, not an if
            targets = torch.where((row_weights == 0).to(targets.device)[:, None], IGNORE, targets)
        return TokenLosses(liger_token_losses(flat, layer, targets.reshape(-1).to(flat.device), dtype).view(b, t))
    losses, spread = chunked_token_losses(flat, layer, targets.reshape(-1).to(flat.device),
                                          chunk_tokens_of(layer, flat.device.type), dtype, entropy)
    return TokenLosses(losses.view(b, t), None if spread is None else spread.view(b, t))


def logit_losses(logits: torch.Tensor, labels: torch.Tensor, entropy: bool = False):
    """(per-token losses ``[B, T-1]``, entropy ``[B, T-1]`` or None) of plain ``logits [B, T, V]`` for the unshifted
    ``labels [B, T]``: position i predicts ``labels[i + 1]`` (``target_losses``)."""
    return target_losses(logits[:, :-1], labels[:, 1:], entropy)


def target_losses(logits: torch.Tensor, targets: torch.Tensor, entropy: bool = False):
    """(per-token losses ``[B, T]``, entropy ``[B, T]`` or None) of ``logits [B, T, V]``, position i predicting
    ``targets[i]``: the fp32 log-softmax of each position's logits, then minus the target's (0 where it is -100), as
    ``F.cross_entropy``; with ``entropy``, each position's ``-sum p log p`` from the same log-softmax (no gradient,
    one row at a time: no second fp32 copy of the logits)."""
    b, t = targets.shape
    logp = logits.float().log_softmax(-1)
    targets = targets.to(logits.device)
    losses = F.nll_loss(logp.reshape(-1, logp.shape[-1]), targets.reshape(-1), ignore_index=IGNORE, reduction="none")
    if not entropy:
        return losses.view(b, t), None
    with torch.no_grad():
        spread = torch.stack([-(row.exp() * row).sum(-1) for row in logp])
    return losses.view(b, t), spread
