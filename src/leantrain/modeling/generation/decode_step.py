"""The decode step of the generation engine, chosen once per generation and said: ``decode_step(model, cache)``
returns ``DecodeChoice(step, name, reason)``.

- ``fused``: ``fast_decode.Decoder``, the forward of one token per row computed from the weights directly, for a
  Llama-shaped model (llama, mistral, qwen2) of plain layers on a reserved cache, where its copies of the weights fit
  the memory left on the model's device;
- ``transformers``: the model's own forward on the cache, for every other model (another architecture, LoRA,
  quantized or sharded weights, a cache that is not reserved, no room for the copies).

Either step takes ``(token, position, mask)`` and returns the fp32 logits (rows, V) of the next token, the token's
keys and values written into the cache. ``cache=None`` asks for the choice alone (``step`` None), for the model as
it would be on the engine's reserved cache: what a record of the run's fast paths says before any generation.
"""

from __future__ import annotations

import logging
from typing import Callable, NamedTuple

import torch

from leantrain.modeling.generation import cache_names, fast_decode
from leantrain.units import format_bytes

FUSED, TRANSFORMERS = "fused", "transformers"
log = logging.getLogger("leantrain")


class DecodeChoice(NamedTuple):
    """The decode step of a generation (None where no cache was given), its ``name`` (``fused`` or
    ``transformers``) and why it was chosen."""

    step: Callable[..., torch.Tensor] | None
    name: str
    reason: str


def decode_step(model, cache=None, chosen: str | None = None) -> DecodeChoice:
    """The decode step for ``model`` (unwrapped) on ``cache`` (the module docstring). ``chosen``: the run's decision
    (``fast_paths.DECODE_STEP``: the engine's connector asked this function about the model alone, ``cache=None``):
    ``transformers`` is taken as it is; ``fused`` still needs the cache to allow it (reserved, within a sliding window,
    room for the weight copies: only the generation knows them), else transformers' forward, with a warning; None
    (a model no command set up): the model and the cache decide here."""
    if chosen == TRANSFORMERS:
        return DecodeChoice(transformers_step(model, cache) if cache is not None else None, TRANSFORMERS,
                            "the run's choice (its record of fast paths)")
    refused = fast_decode.refusal(model, cache) or no_room(model, cache)
    if refused is None:
        step = fast_decode.Decoder(model, cache) if cache is not None else None
        return DecodeChoice(step, FUSED, f"{model.config.model_type} is Llama-shaped: the fused decode step")
    if chosen == FUSED:
        log.warning("decode step: transformers' forward, not the fused step the run chose: %s", refused)
    step = transformers_step(model, cache) if cache is not None else None
    return DecodeChoice(step, TRANSFORMERS, f"{refused}: transformers' forward")


def transformers_step(model, cache) -> Callable[..., torch.Tensor]:
    """The decode step through the model's own forward: fp32 logits (rows, V) of one token per row (``Decoder``'s
    signature)."""
    def step(token: torch.Tensor, position: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=position, use_cache=True,
                    **cache_names.passed(cache))
        return out.logits[:, -1].float()
    return step


def no_room(model, cache) -> str | None:
    """Why the fused step's weight copies do not fit the memory free on the model's device (None: they do, or the
    free memory is not known, or there is no cache to read the copies' dtype from)."""
    if cache is None:
        return None
    need = fast_decode.copied_bytes(model, cache.layers[0].values.dtype)
    free = free_bytes(model.get_output_embeddings().weight.device)
    if free is None or need <= free:
        return None
    return f"its weight copies ({format_bytes(need)}) do not fit the free memory ({format_bytes(free)})"


def free_bytes(device: torch.device) -> int | None:
    """Memory a new tensor can take on ``device``: a GPU's free memory plus what PyTorch's allocator holds unused;
    the CPU's available RAM; None elsewhere."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        import psutil  # lazy: only the CPU's room needs it

        return int(psutil.virtual_memory().available)
    return None
