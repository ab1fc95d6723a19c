"""Stop strings: text that ends a completion beside its EOS (``grpo.stop``: ``"</answer>"``, ``"\\n\\nQuestion:"``), as
vLLM's and transformers' ``stop`` / ``stop_strings`` do.

A token sequence has many spellings of one string, so a row's text is checked, not its ids: after each token the last
``window`` tokens of every row still decoding are decoded and searched for each string. A string of n characters
spans at most n + 1 tokens (each token holds at least one character, and the first may start before the string), so
the window catches every string the moment its last token is written. The row ends at that token, which stays in the
completion with the string (its tokens are trained on, as an EOS is). The check reads the new tokens on the host: one
small ``batch_decode`` per token, only where stop strings are given.
"""

from __future__ import annotations

import torch


class StopStrings:
    """``(ids, rows, taken) -> bool (len(rows),)``: whether each decoding row's text (``ids[rows, :taken]``) ends
    with one of ``strings`` in its last ``window`` tokens (the module docstring)."""

    def __init__(self, tokenizer, strings) -> None:  # noqa: ANN001 - a tokenizer
        self.tokenizer, self.strings = tokenizer, tuple(s for s in strings if s)
        self.window = max(len(s) for s in self.strings) + 1 if self.strings else 0

    def __call__(self, ids: torch.Tensor, rows: torch.Tensor, taken: int) -> torch.Tensor:
        tails = self.tokenizer.batch_decode(ids[rows, max(0, taken - self.window):taken].tolist(),
                                            skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.strings) for t in tails], dtype=torch.bool, device=ids.device)

    def first_end(self, ids: list[int]) -> int | None:
        """The length of ``ids`` up to and including the token that first completes a stop string, or None: the
        same cut as the decode loop's check token by token (for an engine that decodes past it, vLLM's)."""
        for taken in range(1, len(ids) + 1):
            tail = self.tokenizer.decode(ids[max(0, taken - self.window):taken], skip_special_tokens=True)
            if any(s in tail for s in self.strings):
                return taken
        return None


def stop_strings(tokenizer, strings) -> StopStrings | None:  # noqa: ANN001 - a tokenizer
    """The check for ``strings`` with ``tokenizer``, or None when there are none (no host work per token)."""
    check = StopStrings(tokenizer, strings or ())
    return check if check.strings else None
