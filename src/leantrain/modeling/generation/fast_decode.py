"""One decoded token per row, computed from the weights directly: the fused decode step of the generation engine
(GRPO, ``leantrain generate``, sample prompts) for Llama-family models (Llama, SmolLM, Mistral, Qwen2), on a reserved
KV cache.

A decoded token costs transformers' forward about 45 small operations per layer, each through ``nn.Module`` calls,
autocast's dispatch and its checks, plus the attention mask built again at every token; for a 135M model at 32 rows
that is as long as the matmuls themselves. ``Decoder`` runs the same computation in ~20 operations per layer:

- q, k and v in one matmul, gate and up in one (their weights concatenated once per generation, in the compute dtype:
  the copies autocast would keep; the same products bit for bit as the separate matmuls);
- the RMS norms as ``F.rms_norm`` (the same formula as the models' own, fused);
- the rotary embedding from the model's own ``rotary_emb`` (every RoPE variant it implements), applied as the models
  apply it, in the same dtype promotion;
- the new key and value written straight into the reserved buffers (``reserved_cache``);
- attention as one SDPA call per layer with the query heads of a key/value head packed as its rows (grouped-query
  attention without repeating the keys; transformers packs them the same way for one query), over a boolean mask.

The dtypes are autocast's: under an autocast the residual stream and the norms stay in fp32 and every matmul runs in
the autocast dtype; without one everything runs in the weights' dtype. Which one is read from the cache the prefill
left (its values are in the matmuls' dtype), so an autocast opened only around the model's forward (Accelerate's
mixed precision) is followed too. The logits equal transformers' forward on the
same cache to rounding (fp32: 1e-5; bf16: as close to the fp32 logits as transformers' own,
``tests/unit/modeling/test_fast_decode.py``); the attention kernel's packing order can differ from transformers' in
the last bit of a bf16 value, so sampled tokens are draws from the same distribution, not always the same draws.

LoRA (peft's model): each adapted linear's copy is its merged weight, the base weight plus peft's own delta
(``get_delta_weight``: scaling x B @ A, in fp32) of every active adapter, made once per generation like the other
copies; the adapters' separate matmuls of transformers' forward become none. The logits equal peft's forward to
rounding (the sum W x + s B A x computed as (W + s B A) x).

``decoder(model, cache)`` returns None, and the caller keeps transformers' forward, for anything else (``refusal``
says which): another architecture or attention variant (sliding windows, q/k norms), quantized layers, an adapter
that is not plain LoRA (DoRA and other variants, adapted embeddings, modules_to_save copies), sharded weights (FSDP,
DeepSpeed ZeRO-3), a cache that is not reserved. ``decode_step.decode_step`` makes the choice and says why.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import rotate_half

from leantrain.modeling.generation.reserved_cache import ReservedLayer
from leantrain.modeling.weight_casts import RecastLinear

MODEL_TYPES = ("llama", "mistral", "qwen2")
NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")
LINEARS = (nn.Linear, RecastLinear)  # RecastLinear is nn.Linear outside a training forward


def decoder(model: nn.Module, cache) -> "Decoder | None":
    """A ``Decoder`` of ``model`` (unwrapped: no DDP or peft wrapper) on ``cache`` when both allow it (module
    docstring), else None."""
    if not takes(model, cache):
        return None
    return Decoder(model, cache)


def takes(model: nn.Module, cache) -> bool:
    """Whether ``Decoder`` computes ``model``'s forward: a Llama-family causal LM of plain linear layers and full
    attention, on a cache whose layers are all reserved."""
    return refusal(model, cache) is None


def refusal(model: nn.Module, cache=None) -> str | None:
    """Why ``Decoder`` cannot compute ``model``'s forward on ``cache`` (None: it can). ``cache`` None: the model
    alone, as it would be on a reserved cache (the Mistral window against the generation's length unchecked)."""
    model = base_of(model)
    config = getattr(model, "config", None)
    kind, inner = getattr(config, "model_type", None), getattr(model, "model", None)
    if kind not in MODEL_TYPES or inner is None or not getattr(inner, "layers", None):
        return f"{kind or type(model).__name__} is not Llama-shaped ({', '.join(MODEL_TYPES)})"
    if config.hidden_act != "silu":
        return f"its activation is {config.hidden_act}, not silu"
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or ())):
        return "not every layer has full attention (layer_types)"
    if cache is not None:
        cached = getattr(cache, "layers", None)
        if not cached or len(cached) != len(inner.layers) or not all(type(c) is ReservedLayer for c in cached):
            return "its KV cache is not reserved (a cache layer other than transformers' DynamicLayer)"
        window = getattr(config, "sliding_window", None)
        if window is not None and window < cached[0].capacity:
            return f"its sliding window ({window}) is shorter than the generation ({cached[0].capacity} positions)"
    if not plain_layers(model):
        return ("a layer is not a plain linear, LoRA linear or norm (quantized, another adapter) or its weights are "
                "sharded (FSDP, ZeRO-3)")
    return None


def base_of(model: nn.Module) -> nn.Module:
    """The transformers model inside peft's wrapper (its linears the LoRA layers), or ``model`` itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def plain_layers(model: nn.Module) -> bool:
    """Every linear layer, norm and the embeddings of a Llama-shaped ``model`` are plain modules of whole tensors."""
    inner = model.model
    norms = [inner.norm] + [n for layer in inner.layers
                            for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    return (all((type(m) in LINEARS and plain(m.weight)) or lora_linear(m) for m in linears(model))
            and all(type(n).__name__ in NORMS and plain(n.weight) for n in norms)
            and isinstance(inner.embed_tokens, nn.Embedding) and plain(inner.embed_tokens.weight)
            and hasattr(inner, "rotary_emb"))


def lora_linear(m: nn.Module) -> bool:
    """peft's LoRA linear over a plain linear, its active adapters plain LoRA (no DoRA or other variant), not merged
    into the base weight, not switched off: its merged weight is ``weight``'s."""
    base, active = getattr(m, "base_layer", None), getattr(m, "active_adapters", None)
    if base is None or active is None or not hasattr(m, "get_delta_weight") or not hasattr(m, "lora_A"):
        return False
    variants = getattr(m, "lora_variant", {}) or {}
    return (type(base) in LINEARS and plain(base.weight) and not m.merged and not m.disable_adapters
            and not any(getattr(m, "use_dora", {}).get(a) or a in variants for a in active))


def applied_weight(m: nn.Module) -> torch.Tensor:
    """A linear's weight as its forward applies it: a LoRA linear's base weight plus each active adapter's delta."""
    if not hasattr(m, "base_layer"):
        return m.weight
    merged = m.base_layer.weight.float()
    with torch.autocast(merged.device.type, enabled=False):  # B @ A in fp32, not in an open autocast's dtype
        for adapter in m.active_adapters:
            if adapter in m.lora_A:
                merged = merged + m.get_delta_weight(adapter).float()
    return merged


def applied_bias(m: nn.Module) -> torch.Tensor | None:
    return m.base_layer.bias if hasattr(m, "base_layer") else m.bias


def linears(model: nn.Module) -> list[nn.Module]:
    """The output layer and every projection of a Llama-shaped ``model``: the weights a ``Decoder`` copies."""
    model = base_of(model)
    layers = model.model.layers
    return [model.get_output_embeddings()] + [m for layer in layers
                                               for m in (*projections(layer.self_attn), *mlp_weights(layer.mlp))]


def copied_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """The bytes of the weight copies a ``Decoder`` of ``model`` makes in ``dtype``."""
    return sum(m.weight.numel() for m in linears(model)) * torch.empty((), dtype=dtype).element_size()


def plain(weight) -> bool:
    """A whole, unsharded floating-point tensor (not a DTensor, not an empty ZeRO-3 placeholder)."""
    return type(weight) in (torch.Tensor, nn.Parameter) and weight.is_floating_point() and weight.numel() > 0


def projections(attention: nn.Module) -> tuple:
    return attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj


def mlp_weights(mlp: nn.Module) -> tuple:
    return mlp.gate_proj, mlp.up_proj, mlp.down_proj


def fused(layers, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights (and biases) of ``layers`` stacked along their outputs, in ``dtype``: one copy, cast on the way."""
    weight = torch.empty((sum(m.out_features for m in layers), layers[0].in_features), dtype=dtype,
                         device=layers[0].weight.device)
    biases = [applied_bias(m) for m in layers]
    bias = weight.new_zeros(weight.shape[0]) if any(b is not None for b in biases) else None
    start = 0
    for m, b in zip(layers, biases):
        weight[start:start + m.out_features].copy_(applied_weight(m))
        if b is not None:
            bias[start:start + m.out_features].copy_(b)
        start += m.out_features
    return weight, bias


class Decoder:
    """``model``'s forward of one token per row on the reserved ``cache`` (module docstring); the weights are copied
    in the compute dtype when it is made, for the generation's lifetime."""

    def __init__(self, model: nn.Module, cache):
        model = base_of(model)
        inner, config = model.model, model.config
        # the prefill's matmul dtype, the cache's (``reserved_cache``): the autocast dtype also where the autocast is
        # only around the model's forward (Accelerate's mixed precision wraps ``forward``), else the weights'
        self.dtype = cache.layers[0].values.dtype
        if torch.is_autocast_enabled(inner.embed_tokens.weight.device.type):
            torch.clear_autocast_cache()  # the prefill's casts of trained weights: the copies below replace them
        self.model, self.cache, self.eps = inner, cache, config.rms_norm_eps
        attention = inner.layers[0].self_attn
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.scale = attention.head_dim, attention.scaling
        self.layers = [self._layer(layer) for layer in inner.layers]
        self.norm = inner.norm.weight
        self.head = fused([model.get_output_embeddings()], self.dtype)

    def _layer(self, layer: nn.Module) -> tuple:
        a, m = layer.self_attn, layer.mlp
        return (layer.input_layernorm.weight, fused([a.q_proj, a.k_proj, a.v_proj], self.dtype),
                fused([a.o_proj], self.dtype), layer.post_attention_layernorm.weight,
                fused([m.gate_proj, m.up_proj], self.dtype), fused([m.down_proj], self.dtype))

    @torch.no_grad()
    def __call__(self, token: torch.Tensor, position: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """fp32 logits (rows, V) of ``token`` (rows,) at ``position`` (rows, 1), attending to the cache's positions
        and itself where ``mask`` (rows, length + 1) is nonzero; the token's keys and values are written to the
        cache."""
        rows, length = token.shape[0], self.cache.layers[0].keys.shape[-2]
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        x = F.embedding(token, self.model.embed_tokens.weight)  # (rows, hidden)
        cos, sin = (t[:, None] for t in self.model.rotary_emb(x, position))  # (rows, 1, 1, d)
        keep = mask[:, None, None, :length + 1].bool()
        for (norm_in, qkv_w, o_w, norm_post, gate_up_w, down_w), cached in zip(self.layers, self.cache.layers):
            qkv = F.linear(self._normed(x, norm_in), *qkv_w).view(rows, h + 2 * kv, 1, d)
            qk = rotated(qkv[:, :h + kv], cos, sin)
            keys, values = cached.update(qk[:, h:], qkv[:, h + kv:])
            query = qk[:, :h].reshape(rows, kv, h // kv, d).to(keys.dtype)  # a key head's query heads as rows
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=keep, scale=self.scale)
            x = x + F.linear(out.reshape(rows, h * d).to(self.dtype), *o_w)
            gate, up = F.linear(self._normed(x, norm_post), *gate_up_w).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, *down_w)
        return F.linear(self._normed(x, self.norm), *self.head).float()

    def _normed(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps).to(self.dtype)


def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding as the Llama family applies it (``apply_rotary_pos_emb``), on queries and keys at once."""
    return x * cos + rotate_half(x) * sin
