r"""The final answer of a math completion, read as GSM8K data and ``\boxed{}`` prompts write it: what the built-in
rewards ``math:COLUMN``, ``format:boxed`` and ``format:gsm8k`` compare and check.

A text's final answer is, in this order:

1. the last ``\boxed{...}`` (braces nested inside it matched; an unclosed one, cut off at ``grpo.max_new_tokens``, is
   not an answer): the first number after its last ``=`` (``\boxed{x = 5}`` is 5, ``\boxed{72 \text{ apples}}`` 72);
2. else the first number after the last ``####`` (GSM8K's answer line, ``#### 72``);
3. else the last number anywhere in the text.

The first of these present decides: a ``\boxed{x}`` with no number in it is a wrong answer, not a cue to look further.
Step 3 is lm-evaluation-harness's gsm8k "flexible-extract" rather than its "strict-match": a small model that has
not yet learnt to box its answer (SmolLM2-135M rarely does when asked) still scores a right number, so its groups are
not all 0 and GRPO has something to learn from; the format is rewarded on its own by ``format:boxed`` /
``format:gsm8k``, its weight saying how much it matters. Only the last number counts, so writing many numbers gains
nothing. For answers accepted only in the asked format, TRL's ``accuracy_reward`` (``trl.rewards:accuracy_reward``)
reads ``\boxed{}`` / LaTeX and nothing else.

Numbers are exact fractions, so ``3/4``, ``\frac{3}{4}`` and ``0.75`` are equal and 0.1 + 0.2 is 0.3. Thousands
commas are dropped (``1,234`` is 1234; a comma elsewhere separates numbers), as are ``$`` and ``%`` (GSM8K writes
50% as ``#### 50``); a trailing period is punctuation; a minus sign counts when it touches the digits and follows no
word or bracket (``-3``, but not the subtraction in ``10-3``).
"""

from __future__ import annotations

import numbers
import re
from fractions import Fraction

_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_SIGNED = rf"(?:(?<![\w)\]}}])-)?(?:{_NUM})"
NUMBER = re.compile(rf"\\[dt]?frac\{{\s*(?P<fn>{_SIGNED})\s*\}}\{{\s*(?P<fd>{_NUM})\s*\}}"
                    rf"|(?P<sn>{_SIGNED})\s*/\s*(?P<sd>{_NUM})"
                    rf"|(?P<n>{_SIGNED})")
BOXED = re.compile(r"\\boxed\s*\{")
GSM8K_LINE = re.compile(rf"####\s*(?:\\?\$\s*)?(?:{NUMBER.pattern})\s*(?:\\?%)?\s*\.?")
THINK = re.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", re.DOTALL | re.MULTILINE)  # TRL's think_format_reward


def _value(m: re.Match) -> Fraction | None:
    """A NUMBER match as a fraction (None for a zero denominator)."""
    read = lambda s: Fraction(s.replace(",", ""))  # noqa: E731
    top, bottom = (m["fn"], m["fd"]) if m["fn"] else (m["sn"], m["sd"]) if m["sn"] else (m["n"], None)
    if bottom is None:
        return read(top)
    return None if read(bottom) == 0 else read(top) / read(bottom)


def numbers_in(text: str) -> list[Fraction]:
    """Every number written in ``text``, in order."""
    return [v for v in map(_value, NUMBER.finditer(text)) if v is not None]


def boxed(text: str) -> str | None:
    r"""The content of the last closed ``\boxed{...}`` in ``text`` (nested braces matched), or None."""
    found = None
    for m in BOXED.finditer(text):
        depth = 1
        for i in range(m.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found = text[m.end():i]
                break
    return found


def final_answer(text: str) -> Fraction | None:
    r"""The final answer of ``text`` (the last ``\boxed{}``, else after the last ``####``, else the last number), or
    None when there is none or the one declared holds no number."""
    content = boxed(text)
    if content is not None:
        found = numbers_in(content.rsplit("=", 1)[-1])
        return found[0] if found else None
    if "####" in text:
        found = numbers_in(text.rsplit("####", 1)[1])
        return found[0] if found else None
    found = numbers_in(text)
    return found[-1] if found else None


def expected(value) -> Fraction | None:  # noqa: ANN001 - a column's value
    """A row's answer: a number as it is, a text read as a completion is (a GSM8K solution ending ``#### 72``, a
    ``\\boxed{}`` answer, ``1,234``, ``3/4``); None when it holds no number."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            return Fraction(str(value))  # str: the float 0.1 as written, not its binary expansion
        except ValueError:  # nan, inf
            return None
    return final_answer(value) if isinstance(value, str) else None


def boxes_a_number(text: str) -> bool:
    r"""``format:boxed``: the final answer is a ``\boxed{}`` holding a number."""
    content = boxed(text)
    return content is not None and bool(numbers_in(content))


def ends_with_gsm8k_answer(text: str) -> bool:
    """``format:gsm8k``: the last non-empty line is GSM8K's ``#### NUMBER`` (``$``, commas, a period allowed)."""
    lines = text.strip().splitlines()
    return bool(lines) and GSM8K_LINE.fullmatch(lines[-1].strip()) is not None


def thinks_then_answers(text: str) -> bool:
    """``format:think``: TRL's ``think_format_reward``, ``<think>...</think>`` first (one), then the answer."""
    return THINK.match(text) is not None
