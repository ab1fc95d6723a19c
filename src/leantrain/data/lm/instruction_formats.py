"""Instruction and chat formats: which format a table is in (auto-detected from the column names, first match wins),
each row read as a list of ``{role, content}`` messages, and every row checked with the problem named.

- ``messages``: a list of ``{role, content}`` (OpenAI); roles system, user, assistant (tool: prompt)
- ``conversations``: a list of ``{from, value}`` (ShareGPT); human -> user, gpt -> assistant, system
- ``instruction`` / ``input`` / ``output`` (Alpaca; ``input`` optional)
- ``instruction`` / ``context`` / ``response`` (Dolly; ``context`` optional)
- ``prompt`` / ``completion``: the two texts joined as they are (no template unless data.template names one)
"""

from __future__ import annotations

from typing import Any, Sequence

import datasets

from leantrain.data.lm.conversation import ROLE_ALIASES, row_tools, with_system
from leantrain.errors import DataError, more_rows

FORMATS = {  # name -> (required columns, optional columns, what the user calls it)
    "messages": (("messages",), (), "messages: a list of {role, content} (OpenAI)"),
    "sharegpt": (("conversations",), (), "conversations: a list of {from, value} (ShareGPT)"),
    "alpaca": (("instruction", "output"), ("input",), "instruction / input / output (Alpaca; input optional)"),
    "dolly": (("instruction", "response"), ("context",), "instruction / context / response (Dolly; context optional)"),
    "prompt_completion": (("prompt", "completion"), (), "prompt / completion (joined as they are)"),
}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
                  "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system", "tool": "tool",
                  **ROLE_ALIASES}
ROLES = ("system", "user", "assistant", "tool")


def detect_format(columns: Sequence[str]) -> str | None:
    """The instruction/chat format of a table with these columns, or None."""
    for name, (required, _, _) in FORMATS.items():
        if all(c in columns for c in required):
            return name
    return None


def looks_like_instructions(columns: Sequence[str]) -> bool:
    """True when the columns are one of the instruction/chat formats (what the causal-LM data side branches on)."""
    return detect_format(columns) is not None


def unknown_format(where: str, columns: Sequence[str]) -> DataError:
    accepted = [desc for _, _, desc in FORMATS.values()]
    return DataError(f"{where}: not instruction/chat data; columns found: {', '.join(columns) or 'none'}; "
                     "formats accepted:", accepted)


# ------------------------------------------------------------------------------------------ conversations


def to_messages(row: dict[str, Any], fmt: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    """One row of a detected format -> a list of {role, content}, opened by the row's ``system`` (else
    ``system_prompt``) unless it has a system turn; raises ValueError saying what is wrong."""
    return with_system(_turns(row, fmt), row, system_prompt)


def _turns(row: dict[str, Any], fmt: str) -> list[dict[str, str]]:
    if fmt == "messages":
        return _chat(row["messages"], "role", "content", {**{r: r for r in ROLES}, **ROLE_ALIASES})
    if fmt == "sharegpt":
        return _chat(row["conversations"], "from", "value", SHAREGPT_ROLES)
    if fmt in ("alpaca", "dolly"):
        extra, answer = ("input", "output") if fmt == "alpaca" else ("context", "response")
        prompt = _text(row.get("instruction"), "instruction")
        more = row.get(extra)
        if more is not None and not isinstance(more, str):
            raise ValueError(f"{extra!r} is {type(more).__name__}, not text")
        if more and more.strip():
            prompt = f"{prompt}\n\n{more}"
        return [{"role": "user", "content": prompt},
                {"role": "assistant", "content": _text(row.get(answer), answer, blank_ok=True)}]
    if fmt == "prompt_completion":
        return [{"role": "user", "content": _text(row.get("prompt"), "prompt")},
                {"role": "assistant", "content": _text(row.get("completion"), "completion", blank_ok=True)}]
    raise ValueError(f"unknown format {fmt!r}")


def _text(value: Any, name: str, blank_ok: bool = False) -> str:
    if value is None:
        raise ValueError(f"{name!r} is missing")
    if not isinstance(value, str):
        raise ValueError(f"{name!r} is {type(value).__name__}, not text")
    if not blank_ok and not value.strip():
        raise ValueError(f"{name!r} is blank")
    return value


def _chat(turns: Any, role_key: str, content_key: str, mapping: dict[str, str] | None) -> list[dict[str, str]]:
    if not isinstance(turns, list) or not turns:
        raise ValueError("the conversation is empty" if isinstance(turns, list) else "the conversation is not a list")
    out = []
    for n, turn in enumerate(turns, 1):
        if not isinstance(turn, dict) or role_key not in turn or content_key not in turn:
            raise ValueError(f"turn {n} has no {role_key!r} / {content_key!r}")
        role = turn[role_key]
        role = mapping.get(str(role).lower())
        if role not in ROLES:
            aliases = ", ".join(f"{a} -> {r}" for a, r in ROLE_ALIASES.items())
            raise ValueError(f"turn {n}: {role_key} {turn[role_key]!r} is none of {', '.join(sorted(mapping))} "
                             f"(read as: {aliases}); rename the role in the data")
        out.append({"role": role, "content": _text(turn[content_key], f"turn {n} {content_key}", blank_ok=True)})
    if not any(m["role"] == "assistant" for m in out):
        raise ValueError("no assistant turn (nothing to learn)")
    return out


# ------------------------------------------------------------------------------------------ checks


def check_rows(ds: datasets.Dataset, fmt: str, where: str, limit: int = 5, name_row=None,  # noqa: ANN001
               convert=None) -> list[str]:  # noqa: ANN001
    """Problems of the rows of a detected format, at most ``limit`` listed; ``name_row(i)`` names row i (a file line:
    ``Part.rows([i])``), else ``row i+1``. ``convert(row, fmt)`` reads a row, raising ValueError (``to_messages``
    by default; preference rows: ``preference_formats.to_example``)."""
    convert = convert or to_messages
    problems, bad = [], 0
    for i, row in enumerate(ds):
        try:
            convert(row, fmt)
            row_tools(row)
        except ValueError as e:
            bad += 1
            if len(problems) < limit:
                problems.append(f"{where}: {name_row(i) if name_row else f'row {i + 1}'}: {e}")
    if bad > limit:
        problems.append(more_rows(where, bad - limit))
    return problems


def blank_responses(ds: datasets.Dataset, fmt: str) -> list[int]:
    """Indices of the rows whose every assistant turn is empty or whitespace (the rows are checked already)."""
    out = []
    for i, row in enumerate(ds):
        if all(not m["content"].strip() for m in to_messages(row, fmt) if m["role"] == "assistant"):
            out.append(i)
    return out
