"""Which engine samples GRPO's completions (``grpo.generation``): leantrain's own (``decode.generate``: the model
being trained, a KV cache) or vLLM colocated in the process (``vllm_engine``); both take the same call and return
the same ``Rollout``."""

from __future__ import annotations

import functools
from typing import Callable

from leantrain.errors import ConfigError
from leantrain.modeling.generation import vllm_engine
from leantrain.modeling.generation.decode import Rollout, generate


def backend(name: str, vllm: vllm_engine.VllmSettings | None = None) -> Callable[..., Rollout]:
    """The generation engine of ``grpo.generation``: ``auto`` and ``transformers`` are ``decode.generate``;
    ``vllm`` is ``vllm_engine.generate`` with ``vllm``'s settings (its memory share, the longest sequence), fed by the
    caller first (``weight_sync``: one read of the weights per generation, timed apart)."""
    if name in ("auto", "transformers"):
        return generate
    if name == "vllm":
        return functools.partial(vllm_engine.generate, settings=vllm or vllm_engine.VllmSettings(), feed=False)
    raise ConfigError(f"grpo.generation={name!r}: expected auto, transformers or vllm")


def weight_sync(name: str, vllm: vllm_engine.VllmSettings | None = None) -> Callable[..., None] | None:
    """What pushes the trained weights into the engine of ``grpo.generation`` before it generates (vLLM's copy of
    them), or None where the engine samples from the model itself (leantrain's)."""
    if name == "vllm":
        return functools.partial(vllm_engine.sync, settings=vllm or vllm_engine.VllmSettings())
    return None


def release() -> None:
    """The run's end: an engine the run built beside its model shut down (vLLM's: its memory and its process groups,
    while they still exist), so that the next run in this process starts its own; nothing when none was built."""
    vllm_engine.Engine.close_current()
