"""Generation: one engine for every caller (GRPO's rollouts and evaluation, ``leantrain generate``, sample prompts):
``sampling`` (prefill, the decode loop, sampling and stopping), ``fast_decode`` (the fused decode step of Llama-shaped
models), ``reserved_cache`` (a KV cache reserved once for the whole generation) and ``prompts`` (prompt texts, room
checks and the transformers ``generate`` path)."""
