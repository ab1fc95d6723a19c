"""The fast paths of a model's forward that a leantrain command decides once, before the model runs, and the forward
then takes as decided: the decode step of generation (``decode_step``: ``fused`` or ``transformers``), GRPO's
shared-prompt forward (``shared_prompts``) and a BERT classifier's first-token last layer (``first_token``).

The one place that decides them is the engine's connector (``engine/devices/paths.py``, for ``train``, ``eval``,
``generate`` and ``plan`` alike): it runs each path's probe (``generation.decode_step.decode_step``,
:func:`prompt_cache_refusal`, ``first_token.refusal``), writes the decision and its reason into the run's record of
fast paths (the log, ``summary.json``'s ``paths``) and onto the model with :func:`decide`; the forward reads it with
:func:`decided`. The decision lives on the model object (its innermost transformers model, under DDP, compile and peft
wrappers), so a copy of the model (a frozen reference made from the policy) takes the same paths. A model no command
set up (a test, a notebook) carries no decision: :func:`decided` returns None and the path falls back to its own probe
(``or_probe``), which is what the connector would have asked.
"""

from __future__ import annotations

from typing import Callable

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from leantrain.modeling.chunked_loss import keeps_logits
from leantrain.modeling.wrappers import unwrapped

DECODE_STEP, SHARED_PROMPTS, FIRST_TOKEN = "decode_step", "shared_prompts", "first_token"
FORWARD_PATHS = (DECODE_STEP, SHARED_PROMPTS, FIRST_TOKEN)
ATTRIBUTE = "leantrain_fast_paths"  # {path: value} on the model


def holder(model: nn.Module) -> nn.Module:
    """The module that carries the decisions: the transformers model inside DDP / compile wrappers and peft's
    (peft's wrappers pass an attribute they lack on to it, and a merged model keeps it)."""
    inner = unwrapped(model)
    base = getattr(inner, "get_base_model", None)
    return base() if callable(base) and hasattr(inner, "peft_config") else inner


def decide(model: nn.Module, path: str, value) -> None:
    """Record on ``model`` the value the connector chose for ``path`` (one of ``FORWARD_PATHS``)."""
    if path not in FORWARD_PATHS:
        raise ValueError(f"unknown fast path {path!r}: one of {', '.join(FORWARD_PATHS)}")
    inner = holder(model)
    setattr(inner, ATTRIBUTE, {**(getattr(inner, ATTRIBUTE, None) or {}), path: value})


def decided(model: nn.Module, path: str):
    """The value the connector chose for ``path`` on ``model`` (None: no command decided it)."""
    return (getattr(holder(model), ATTRIBUTE, None) or {}).get(path)


def or_probe(model: nn.Module, path: str, probe: Callable[[nn.Module], object]):
    """The decision on ``model`` for ``path``, else (a model no command set up) what ``probe(model)`` says."""
    value = decided(model, path)
    return probe(model) if value is None else value


def prompt_cache_refusal(model: nn.Module) -> str | None:
    """Why ``model``'s forward cannot encode GRPO's prompts once and carry their KV cache through the backward
    (``methods/grpo/forward.py``'s shared prompts), whatever its gradient checkpointing (:func:`checkpointed`: the
    memory planner switches it on and off for its calibration passes); None: it can. Its wrappers as they are now:
    the connector asks it of the model before it is placed, and reads the strategy that will wrap it."""
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    if isinstance(getattr(inner, "module", None) or getattr(inner, "_orig_mod", None), nn.Module):
        return "a wrapper other than DDP (FSDP1, DeepSpeed, torch.compile's module) does not pass the cache through"
    if not keeps_logits(inner):
        return f"{type(unwrapped(inner)).__name__}'s forward takes no logits_to_keep"
    if any(type(m).__name__.startswith("FSDP") for m in inner.modules()):
        return "FSDP's sharded modules do not pass the cache through"
    return None


def checkpointed(model: nn.Module) -> bool:
    """Whether gradient checkpointing is on in ``model`` now (transformers drops the cache under it, and a recompute
    would append to it twice: no shared prompts then)."""
    return any(getattr(m, "gradient_checkpointing", False) is True or type(m).__name__ == "CheckpointWrapper"
               for m in unwrapped(model).modules())
