"""Which computation of a causal LM's output-layer loss a run uses (``efficiency.chunked_loss=auto``), and the fused
one from Liger-Kernel.

:func:`choose_output_loss` is the whole decision, a pure function of what the device offers:

- ``liger``: CUDA with Triton and ``liger_kernel`` importable (``pip install leantrain[liger]``): Liger's fused linear
  cross-entropy (``liger_kernel.transformers.fused_linear_cross_entropy.LigerFusedLinearCrossEntropyLoss``), Triton
  kernels that compute the loss and its gradient chunk by chunk without the ``tokens x vocab`` logits;
- ``plain``: the model's own logits, when they and their gradient (tokens x vocab x 4 bytes x 2) fit
  ``PLAIN_SHARE`` of the memory budget: no recomputation of the output layer;
- ``chunked``: leantrain's chunked loss (``leantrain.modeling.chunked_loss``): CPU's default, and the fallback.

Liger's ``reduction="none"`` computes the gradients in its forward pass and, in releases before its fix
(linkedin/Liger-Kernel#1298), scales all of them by the first token's incoming gradient. leantrain's loss gives every
token of a row the row's ``loss_weight`` (rows of weight 0, which only keep processes in step, have their targets
masked before the kernel, by ``leantrain.modeling.token_losses``: no gradient reaches them): uniform unless a loss
weighs tokens differently (preference losses, whose task says so with ``Traits(uniform_token_gradients=False)``:
``auto`` does not choose Liger for them).
:func:`liger_token_losses` checks the incoming gradient is uniform over the tokens with a target and stops the run
(naming the way out) if it is not, rather than train on wrong gradients.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

IGNORE = -100
PLAIN_SHARE = 0.25  # auto: the plain logits when they and their gradient take at most this share of the budget


def liger_available() -> bool:
    """CUDA, Triton and ``liger_kernel`` are all there (nothing is imported: only looked up)."""
    return (torch.cuda.is_available() and importlib.util.find_spec("triton") is not None
            and importlib.util.find_spec("liger_kernel") is not None)


def plain_logits_bytes(tokens: int, vocab: int) -> int:
    """The fp32 logits of ``tokens`` tokens and their gradient."""
    return int(tokens) * int(vocab) * 4 * 2


def choose_output_loss(device_type: str, liger: bool, logits_bytes: int | None,
                       budget: int | None, uniform: bool = True) -> tuple[str, str]:
    """(``liger`` | ``plain`` | ``chunked``, why) for ``efficiency.chunked_loss=auto``. ``liger``: whether
    :func:`liger_available`; ``logits_bytes``: :func:`plain_logits_bytes` of a micro-batch (None: not known yet, as
    with ``train.micro_batch_size=auto``); ``budget``: the process's memory budget in bytes (None: unknown);
    ``uniform``: the task's loss gives every token of a row the same incoming gradient
    (``task.traits.uniform_token_gradients``; false for the preference losses: Liger is not chosen for them)."""
    if device_type != "cuda":
        return "chunked", f"{device_type} has no fused kernel"
    if liger and uniform:
        return "liger", "CUDA with Triton and liger_kernel: Liger's fused linear cross-entropy"
    missing = ("this task's loss weighs tokens differently (Liger's reduction='none' gradient needs them equal)"
               if liger else "liger_kernel is not installed")
    if logits_bytes is None or budget is None:
        what = "the micro-batch (train.micro_batch_size=auto)" if logits_bytes is None else "the memory budget"
        hint = "" if liger else " (pip install leantrain[liger])"
        return "chunked", f"{missing}{hint} and {what} is not known before the loss is chosen: the chunked loss"
    gib = 2**30
    if logits_bytes <= PLAIN_SHARE * budget:
        return "plain", (f"{missing} and the logits with their gradient ({logits_bytes / gib:.2f} "
                         f"GiB) fit {PLAIN_SHARE:.0%} of the budget ({budget / gib:.1f} GiB): the plain loss")
    return "chunked", (f"{missing} and the logits with their gradient ({logits_bytes / gib:.2f} "
                       f"GiB) exceed {PLAIN_SHARE:.0%} of the budget ({budget / gib:.1f} GiB): the chunked loss")


def _check_uniform(keep: torch.Tensor):
    """A gradient hook: the incoming gradient of the per-token losses is the same on every token that has a target
    (-100 tokens get none from Liger whatever their incoming gradient), else a RuntimeError naming the way out."""

    def check(grad: torch.Tensor) -> torch.Tensor:
        real = grad[keep]
        if real.numel() and not torch.all(real == real[0]):
            raise RuntimeError(
                "efficiency.chunked_loss=auto chose Liger's fused linear cross-entropy, whose reduction='none' gradient "
                "is right only when every token's loss gets the same incoming gradient (releases before "
                "linkedin/Liger-Kernel#1298); this loss weighs tokens differently (a preference loss, or rows with "
                "different loss weights): set efficiency.chunked_loss=true (the chunked loss)")
        return grad

    return check


def liger_token_losses(flat: torch.Tensor, layer: nn.Module, targets: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
    """Per-token losses ``[N]`` (fp32) of the output ``layer`` on the hidden states ``flat [N, H]`` against
    ``targets [N]`` (-100: no loss; the caller masks the targets of rows of weight 0, so that every token with a target
    gets the same incoming gradient in a batch of equal weights), through Liger's fused linear cross-entropy (CUDA),
    the matmul in ``dtype`` (the forward's autocast dtype, as the plain layer's)."""
    from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss  # lazy: CUDA

    flat, targets, weight = flat.to(dtype).contiguous(), targets.contiguous(), layer.weight.to(dtype)
    bias = getattr(layer, "bias", None)
    losses = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE, reduction="none")(
        weight, flat, targets, bias.to(weight.dtype) if bias is not None else None)
    if isinstance(losses, tuple):  # releases that can also return the z-loss
        losses = losses[0]
    if losses.shape != targets.shape:
        raise RuntimeError(f"liger_kernel returned losses of shape {tuple(losses.shape)} for reduction='none' "
                           f"(expected {tuple(targets.shape)}); upgrade liger-kernel or set efficiency.chunked_loss=true")
    if losses.requires_grad:
        losses.register_hook(_check_uniform(targets != IGNORE))
    return losses.float()
