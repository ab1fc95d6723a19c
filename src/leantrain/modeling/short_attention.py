"""SDPA whose backward is computed with matmuls for short rows on the CPU in bf16 / fp16 (``leantrain_sdpa``).

PyTorch's CPU flash-attention backward is slow in bf16 for short rows: 35 ms for 32 rows x 9 heads of 16 queries
over 50 keys, against 8 ms for the same gradients as five matmuls and a softmax in fp32 (and 11 ms for its own fp32
backward); 8 ms against 1 ms for 4 x 9 heads of 34 x 34. Its forward is fast. So where the attention of one head is
at most ``MAX_SCORES`` query x key scores, the forward is SDPA's, and the backward recomputes the probabilities from
the saved queries and keys and takes the textbook gradients in fp32 (``_ShortBackward``); longer rows, where the
flash backward wins (256 x 256 and up), keep SDPA's own backward. ``benchmarks/speed/attention_backward.py``
measures both per shape.

Grouped-query attention packs each key/value head's query heads into its rows (as transformers' ``pack_gqa`` does
for one query) instead of repeating the keys and values per query head: the same scores, and no repeated copies
kept for the backward.

It is registered with transformers' attention and mask interfaces as ``leantrain_sdpa`` (the masks are SDPA's), and
``choose_attention`` builds CPU models trained in bf16 / fp16 with it (``auto``). A call outside that case (no
gradient, fp32, dropout, a float mask or bias, a causal flag without a mask, longer rows, another device) is
transformers' ``sdpa_attention_forward`` unchanged; so are generation and evaluation. The name is not saved with the
model (transformers leaves ``_attn_implementation`` out of config.json).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "leantrain_sdpa"
MAX_SIDE = 128
MAX_SCORES = MAX_SIDE * MAX_SIDE  # query x key scores of one head at most (benchmarks/speed/attention_backward.py)
HALF = (torch.bfloat16, torch.float16)


class _ShortBackward(torch.autograd.Function):
    """SDPA of ``q (B, H, Lq, D)``, ``k, v (B, H, Lk, D)`` with a boolean ``mask`` broadcastable to
    ``(B, H, Lq, Lk)``; the backward recomputes the probabilities and takes the gradients in fp32."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        ctx.save_for_backward(q, k, v, mask, out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, k, v, mask, out = ctx.saved_tensors
        f32, scale = torch.float32, ctx.scale
        qf, kf, vf, gf = q.to(f32), k.to(f32), v.to(f32), grad.to(f32)
        scores = torch.matmul(qf, kf.transpose(-1, -2)).mul_(scale)
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))
        p = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # a row with no key: no attention, no gradient
        grad_v = torch.matmul(p.transpose(-1, -2), gf)
        grad_p = torch.matmul(gf, vf.transpose(-1, -2))
        grad_s = p.mul_(grad_p.sub_((gf * out.to(f32)).sum(-1, keepdim=True))).mul_(scale)
        grad_q = torch.matmul(grad_s, kf)
        grad_k = torch.matmul(grad_s.transpose(-1, -2), qf)
        return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, None


def compute_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype SDPA computes ``query`` in: autocast's lower precision for fp32 inputs inside an autocast region
    (rotary embeddings leave queries and keys in fp32 there, the values in bf16), else their own."""
    device = query.device.type
    if query.dtype == torch.float32 and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return query.dtype


def takes_short_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask, dropout: float,
                         kwargs: dict) -> bool:
    """Whether this call's backward is the matmul one (module docstring): a CPU training call computed in bf16 /
    fp16, no dropout, a boolean mask shared by the heads (or none, non-causal), at most ``MAX_SCORES`` scores per
    head."""
    grads = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    plain = not any(kwargs.get(k) for k in ("position_bias", "softcap", "output_attentions", "s_aux", "sinks"))
    shape_ok = query.shape[-1] == key.shape[-1] == value.shape[-1] and query.shape[2] * key.shape[2] <= MAX_SCORES
    mask_ok = mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1 if mask is not None else True
    dtypes = {compute_dtype(t) for t in (query, key, value)}
    return (grads and plain and shape_ok and mask_ok and dropout == 0.0 and query.device.type == "cpu"
            and len(dtypes) == 1 and dtypes <= set(HALF))


def boolean_mask(module, query: torch.Tensor, key: torch.Tensor, attention_mask, is_causal: bool | None):
    """``(mask, ok)``: the boolean mask of this call (transformers leaves it out, for SDPA's causal flag, where no row
    is padded: then the lower triangle of a square block); ok False where it cannot be made here (a causal block of
    fewer queries than keys without a mask)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is not None or not causal or query.shape[2] == 1:
        return attention_mask, True
    if query.shape[2] != key.shape[2]:
        return None, False
    square = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device)
    return square.tril()[None, None], True


def leantrain_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                   dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' attention-function signature: ``query (B, H, Lq, D)``, ``key, value (B, Hkv, Lk, D)`` ->
    ``(out (B, Lq, H, D), None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # lazy: transformers is slow

    mask, ok = boolean_mask(module, query, key, attention_mask, is_causal)
    if not (ok and takes_short_backward(query, key, value, mask, dropout, kwargs)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    dtype = compute_dtype(query)  # autocast's cast of SDPA's inputs, made here
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    b, h, lq, d = query.shape
    groups = h // key.shape[1]
    q = query.reshape(b, key.shape[1], groups * lq, d)  # each key/value head's query heads as its rows
    mask = mask.repeat(1, 1, groups, 1) if mask is not None and groups > 1 else mask
    scale = scaling if scaling is not None else d ** -0.5
    out = _ShortBackward.apply(q, key, value, mask, scale)
    return out.reshape(b, h, lq, d).transpose(1, 2).contiguous(), None


def register() -> str:
    """``leantrain_sdpa`` in transformers' attention and mask interfaces (its masks are SDPA's); returns the name."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # lazy: as above
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(NAME, leantrain_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
