"""Switches on the model itself, before it is wrapped: gradient checkpointing on / off, and the repeated blocks
(the unit FSDP shards one by one and the memory model sizes)."""

from __future__ import annotations

from torch import nn

from leantrain.errors import ConfigError


def enable_checkpointing(model: nn.Module) -> None:
    """Non-reentrant gradient checkpointing on a transformers model (ConfigError if it has none)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(f"efficiency.gradient_checkpointing: {type(model).__name__} does not support it")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name; the old one warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False
    input_grads_for_frozen_embeddings(model)


def embeddings_of(model: nn.Module, getter: str = "get_input_embeddings") -> nn.Module | None:
    """``model.get_input_embeddings()`` (or ``getter``: ``get_output_embeddings``), or None where the model has none:
    transformers raises NotImplementedError for some image and audio models (e.g. ConvNext)."""
    get = getattr(model, getter, None)
    try:
        return get() if callable(get) else None
    except NotImplementedError:
        return None


def input_grads_for_frozen_embeddings(model: nn.Module) -> None:
    """With frozen input embeddings (LoRA, model.freeze=[embeddings]) the first checkpointed block's input carries no
    grad: transformers' ``enable_input_require_grads`` marks the embedding output so the recomputed graph reaches
    the trainable parameters (needed by reentrant checkpointing, harmless with the non-reentrant kind)."""
    emb = embeddings_of(model)
    if emb is not None and not any(p.requires_grad for p in emb.parameters()) and \
            hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()


def is_checkpointing(model: nn.Module) -> bool:
    """Whether gradient checkpointing is on (transformers' old and new attribute names; a peft model's base model is
    asked, whose class has them: the wrapper forwards the old, deprecated one)."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    flag = "is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    return bool(getattr(base, flag, False))


def set_checkpointing(model: nn.Module, on: bool) -> None:
    """Turn gradient checkpointing on or off (the memory model measures both)."""
    if on:
        enable_checkpointing(model)
    elif is_checkpointing(model):
        off = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
        off()


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks to shard one by one: the model's _no_split_modules, else the longest ModuleList."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if blocks:
        return blocks
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 1]
    return list(max(lists, key=len)) if lists else []
