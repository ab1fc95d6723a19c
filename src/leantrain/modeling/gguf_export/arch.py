"""What each exportable architecture is in GGUF: its ``general.architecture`` name, its hyper-parameter keys and its
tensors (HF name -> GGUF name, and the Q/K permutation Llama needs).

llama.cpp applies rotary embeddings to interleaved pairs of a head's dimensions (GPT-J style) for the ``llama``
architecture, while Hugging Face's Llama rotates the first half against the second; llama.cpp's converter therefore
reorders the rows of each head of ``q_proj`` / ``k_proj`` (``permute_qk``), and transformers undoes it when it reads a
GGUF file. Qwen2 / Qwen3 use the half-rotation in llama.cpp too (NEOX), so their weights go unchanged."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from leantrain.errors import UserError


@dataclass(frozen=True)
class GgufArch:
    """One Hugging Face architecture as GGUF holds it."""

    name: str  # general.architecture (also the prefix of its keys)
    permute_qk: bool  # reorder the rows of q_proj / k_proj for llama.cpp's rotary layout


ARCHS = {
    "LlamaForCausalLM": GgufArch("llama", True),
    "MistralForCausalLM": GgufArch("llama", True),  # llama.cpp runs Mistral as llama (its converter does the same)
    "Qwen2ForCausalLM": GgufArch("qwen2", False),
    "Qwen3ForCausalLM": GgufArch("qwen3", False),
}


def supported() -> str:
    return ", ".join(ARCHS)


def gguf_arch(config, folder: str) -> GgufArch:  # noqa: ANN001 - a transformers config
    """The GGUF form of ``config``'s architecture; exit 2 naming it and the supported ones otherwise."""
    archs = getattr(config, "architectures", None) or [f"(model_type {getattr(config, 'model_type', '?')})"]
    for a in archs:
        if a in ARCHS:
            check_rope(config, folder)
            return ARCHS[a]
    raise UserError(f"{folder}: leantrain cannot export a {', '.join(archs)} to GGUF; supported: {supported()} "
                    "(decoder-only language models)")


def rope_settings(config) -> dict:  # noqa: ANN001
    """``rope_theta`` and the scaling type, from transformers 5's ``rope_parameters`` or the older fields."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = getattr(config, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return {"theta": float(theta), "type": kind}


def check_rope(config, folder: str) -> None:  # noqa: ANN001
    kind = rope_settings(config)["type"]
    if kind != "default":
        raise UserError(f"{folder}: rotary scaling {kind!r} (rope_parameters / rope_scaling) is not exported to GGUF "
                        "yet; leantrain exports models with the default rotary embedding")


def head_dim(config) -> int:  # noqa: ANN001
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def hparams(config, arch: GgufArch, n_vocab: int) -> list[tuple[str, object, str]]:  # noqa: ANN001
    """(key, value, kind) for each hyper-parameter, kind one of uint32 / float32, as llama.cpp reads them."""
    a = arch.name
    keys = [(f"{a}.block_count", config.num_hidden_layers, "uint32"),
            (f"{a}.context_length", config.max_position_embeddings, "uint32"),
            (f"{a}.embedding_length", config.hidden_size, "uint32"),
            (f"{a}.feed_forward_length", config.intermediate_size, "uint32"),
            (f"{a}.attention.head_count", config.num_attention_heads, "uint32"),
            (f"{a}.attention.head_count_kv", getattr(config, "num_key_value_heads", None)
             or config.num_attention_heads, "uint32"),
            (f"{a}.rope.freq_base", rope_settings(config)["theta"], "float32"),
            (f"{a}.attention.layer_norm_rms_epsilon", config.rms_norm_eps, "float32"),
            (f"{a}.vocab_size", n_vocab, "uint32"),
            (f"{a}.rope.dimension_count", head_dim(config), "uint32")]
    if getattr(config, "head_dim", None) or head_dim(config) != config.hidden_size // config.num_attention_heads:
        keys += [(f"{a}.attention.key_length", head_dim(config), "uint32"),
                 (f"{a}.attention.value_length", head_dim(config), "uint32")]
    return keys


def permute_qk(w: np.ndarray, heads: int) -> np.ndarray:
    """The rows of each of ``heads`` heads reordered from (first half, second half) to interleaved pairs: row ``i``
    of a head's first half goes to ``2i``, of its second half to ``2i + 1`` (a bias is permuted like its rows)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of ``permute_qk``."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensor_plan(config, arch: GgufArch, hf_names: list[str]) -> list[tuple[str, str, int | None]]:  # noqa: ANN001
    """(GGUF name, HF name, heads to permute over or None) for every tensor to write, in the file's order. The output
    layer is left out when the embeddings are tied (llama.cpp then uses token_embd); an HF tensor without a GGUF name
    exits 2 naming it."""
    import gguf  # lazy: the optional gguf package

    enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch.name)
    names = gguf.get_tensor_name_map(enum, config.num_hidden_layers)
    tied = getattr(config, "tie_word_embeddings", False)
    heads = {"q_proj": config.num_attention_heads,
             "k_proj": getattr(config, "num_key_value_heads", None) or config.num_attention_heads}
    plan, unknown = [], []
    for hf in hf_names:
        if hf.endswith("rotary_emb.inv_freq") or (tied and hf == "lm_head.weight"):
            continue
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if name is None:
            unknown.append(hf)
            continue
        proj = hf.split(".")[-2]
        plan.append((name, hf, heads[proj] if arch.permute_qk and proj in heads else None))
    if unknown:
        raise UserError(f"these weights have no GGUF name for {arch.name}: {', '.join(unknown[:5])}"
                        + (f" (+{len(unknown) - 5} more)" if len(unknown) > 5 else ""))
    if not tied and not any(g == "output.weight" for g, _, _ in plan):
        raise UserError("the model has no lm_head.weight but does not tie its embeddings (tie_word_embeddings=false)")
    return plan
