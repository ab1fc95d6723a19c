"""Generation: one engine for every caller (GRPO's rollouts and evaluation, ``leantrain generate``, sample prompts).

Read top-down: ``continuations`` (prompt texts in, new texts out) -> ``decode`` (``generate``: the prefill, the
cache reserved, the decode loop, stopping at EOS) -> ``decode_step`` (which step decodes a token, and why: the fused
step of ``fast_decode`` or transformers' forward) and ``sampling`` (the next token: greedy, or a draw after
temperature / top-k / top-p) -> ``reserved_cache`` (a KV cache reserved once for the whole generation).
``prompts`` holds the prompt texts (chat templates) and the checks of a generation's settings and room."""
