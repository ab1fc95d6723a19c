"""Weight casts made again in the backward instead of kept (``efficiency.recast_weights``).

Under bf16 (or fp16) autocast over fp32 weights, every ``nn.Linear`` casts its weight to bf16 in the forward, and the
matmul keeps that copy until the backward, to compute its input's gradient: 2 bytes per weight of every linear layer,
held from each forward to its backward. For SmolLM2-135M that is 0.21 GB a forward, twice over when a step runs two
forwards (GRPO's prompts, then its completions on their cache). ``RecastLinear`` runs the same computation through
an autograd function that keeps the fp32 weight (alive anyway) and casts it again in the backward: the same calls
on the same operands, so the same outputs and gradients bit for bit (tested against autocast's own linear, trained
and frozen weights, ``tests/unit/modeling/test_weight_casts.py``), for one more cast per linear layer per backward.
The input's cast is shared by the layers that read one input (q, k and v; gate and up), where autocast makes and
keeps one copy per layer. One difference remains, by rounding only: where one autocast region runs a weight twice
(two forwards inside one ``torch.autocast``), autocast casts it once and adds the two uses' gradients in bf16 before
casting them to fp32; here each use's gradient is cast, and they are added in fp32. Accelerate opens a region per
forward of the model, so a run's forwards (GRPO's two included) do not share casts.

Where it applies, per call: a training forward (the module in training mode, grad enabled) under an autocast whose
dtype is lower than the fp32 weight's, on a plain ``nn.Linear`` without bias (autocast runs a biased 3-D linear as
``addmm``, another kernel) and a contiguous input. Elsewhere (evaluation, generation, fp32 runs) the module is
``nn.Linear``. The output layer is one too (the chunked loss, installed after it, keeps its own fp32 weight and
calls this forward for plain logits); subclasses are left alone (bitsandbytes' 4-bit layers). It is not installed
where the weight a backward reads is not the forward's: FSDP and DeepSpeed gather the weights for the forward and
free them after it; nor under gradient checkpointing (the blocks keep nothing to save) or compile.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn


_last_cast: list = [None]  # (a weak reference to an input, its version, the dtype, its cast): the one shared


def input_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dtype)``, the same tensor again for the same unchanged ``x`` as the last call's (q, k and v read one
    input): the same values, kept once for the backward."""
    last = _last_cast[0]
    if last is not None and last[0]() is x and last[1] == x._version and last[2] == dtype:
        return last[3]
    cast = x.to(dtype)
    if cast is not x:
        _last_cast[0] = (weakref.ref(x), x._version, dtype, cast)
    return cast


class _RecastLinear(torch.autograd.Function):
    """``x.to(dtype) @ weight.to(dtype)^T`` as autocast computes it (a 3-D input folded into one ``mm``), keeping the
    fp32 ``weight`` instead of its cast. The backward makes the cast again and runs the two ``mm`` calls autograd's
    own formulas run for that ``mm`` (``grad @ w``, and ``grad^T @ x`` for the column-major ``w^T``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        x_cast = input_cast(x, dtype)
        ctx.dtype, ctx.input_dtype, ctx.input_shape = dtype, x.dtype, x.shape
        ctx.save_for_backward(x_cast if ctx.needs_input_grad[1] else None, weight)
        flat = x_cast.reshape(-1, x.shape[-1])
        return flat.mm(weight.to(dtype).t()).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x_cast, weight = ctx.saved_tensors
        grad = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.mm(weight.to(ctx.dtype)).view(ctx.input_shape).to(ctx.input_dtype)
        if ctx.needs_input_grad[1]:
            grad_w = grad.t().mm(x_cast.reshape(-1, x_cast.shape[-1])).to(weight.dtype)
        return grad_x, grad_w, None


def recast_dtype(module: nn.Linear, x: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype this call's weight cast is made again in the backward for, or None: the plain forward."""
    weight = module.weight
    if not (module.training and torch.is_grad_enabled()) or module.bias is not None or weight.dtype != torch.float32:
        return None
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return None
    dtype = torch.get_autocast_dtype(device)
    if dtype not in (torch.bfloat16, torch.float16) or x.dtype not in (torch.float32, dtype) or not x.is_contiguous():
        return None
    return dtype


class RecastLinear(nn.Linear):
    """``nn.Linear`` whose training forward under autocast keeps the fp32 weight for the backward instead of its cast
    (module docstring); the same parameters, state-dict keys and outputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = recast_dtype(self, x)
        if dtype is None:
            return F.linear(x, self.weight, self.bias)
        if not x.numel():  # no rows (an empty ``logits_to_keep``): nothing to cast the weight for
            return x.new_zeros((*x.shape[:-1], self.out_features), dtype=dtype)
        return _RecastLinear.apply(x, self.weight, dtype)


def install_recast(model: nn.Module) -> int:
    """Make every plain bias-free ``nn.Linear`` of ``model`` a :class:`RecastLinear` (in place: the class of the
    instance). Returns how many."""
    swapped = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.bias is None:
            module.__class__ = RecastLinear
            swapped += 1
    return swapped
