"""Preference and feedback rows: which format a table is in (``detect_format``) and each row as a prompt with its
responses (``to_pair``, ``to_feedback``), checked row by row (``check_rows``) with the problem named.

A prompt is either text (TRL's standard form: rendered as it is, like SFT's prompt / completion rows) or a list of
``{role, content}`` messages (conversational: rendered with the chat template, as SFT renders chat data); a response
is always the text of the assistant's reply. See ``leantrain.data.lm.preference`` for the data contract.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from leantrain.data.lm import instruction_formats as formats_

HH_ASSISTANT, HH_HUMAN = "\n\nAssistant:", "\n\nHuman:"
FORMATS = {  # name -> (required columns, optional columns, what the user calls it)
    "sharegpt": (("conversations", "chosen", "rejected"), (),
                 "conversations: [{from, value}] + chosen / rejected: {from, value} (ShareGPT)"),
    "alpaca": (("instruction", "chosen", "rejected"), ("input",), "instruction / input / chosen / rejected (Alpaca)"),
    "explicit": (("prompt", "chosen", "rejected"), (),
                 "prompt / chosen / rejected, texts or message lists (TRL's explicit prompt)"),
    "implicit": (("chosen", "rejected"), (),
                 "chosen / rejected full transcripts sharing their prompt (HH-RLHF '\\n\\nHuman: ... \\n\\nAssistant:'"
                 " texts, or message lists)"),
    "feedback": (("label",), ("prompt", "completion", "messages"),
                 "prompt / completion / label (true/false), or messages / label (unpaired feedback, KTO)"),
}
PAIRED = ("sharegpt", "alpaca", "explicit", "implicit")
PREFERENCE_COLUMNS = ("chosen", "rejected", "label")
CHAT = "{role, content}"  # beside instruction data: what says it is preference data


@dataclass(frozen=True)
class Example:
    """One prompt and its response(s): ``prompt`` text or messages; ``chosen`` / ``rejected`` (pairs) or
    ``completion`` + ``desirable`` (feedback)."""

    prompt: str | list[dict[str, str]]
    chosen: str = ""
    rejected: str = ""
    desirable: bool | None = None

    @property
    def textual(self) -> bool:
        return isinstance(self.prompt, str)


BOOL_TEXTS = {"true": True, "false": False, "1": True, "0": False}  # a feedback label written as text (CSV, JSON)


def _bool_label(value: Any) -> bool | None:
    """A feedback label as a bool: true / false, 1 / 0, or those as text ("true", "False", "1", "0"); else None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return BOOL_TEXTS.get(value.strip().lower())
    return None


def feedback_labels(labels: Iterable[Any]) -> bool:
    """Whether every given value of a ``label`` column reads as a feedback label (missing ones are the rows' own
    problem, named row by row; with none given, the columns alone decide)."""
    try:
        values = set(labels)
    except TypeError:  # lists, dicts: not feedback labels
        return False
    values.discard(None)
    return all(_bool_label(v) is not None for v in values)


def detect_format(columns: Sequence[str], labels: Iterable[Any] | None = None) -> str | None:
    """The preference format of a table with these columns, or None when it is not preference data:
    ``sharegpt``, ``alpaca``, ``explicit``, ``implicit`` (pairs), ``feedback`` (unpaired). ``labels``: the values
    of its ``label`` column, which say whether it is KTO feedback (every value true / false or 1 / 0, as bools,
    numbers or text) or a class label; unset: the columns alone decide."""
    cols = set(columns)
    for name in PAIRED:
        if set(FORMATS[name][0]) <= cols:
            return name
    if "label" in cols and ({"prompt", "completion"} <= cols or "messages" in cols):
        if labels is None or feedback_labels(labels):
            return "feedback"
    return None


def table_format(ds) -> str | None:  # noqa: ANN001 - a datasets.Dataset
    """``detect_format`` of a table: its columns and the values of its ``label`` column, all of them (a first row of
    "1" must not make a file of "1" / "0" labels something else)."""
    columns = ds.column_names
    return detect_format(columns, ds["label"] if "label" in columns else None)


def describe(fmt: str) -> str:
    return FORMATS[fmt][2]


def accepted() -> list[str]:
    return [desc for *_, desc in FORMATS.values()]


def keep_columns(fmt: str, columns: Sequence[str]) -> list[str]:
    required, optional, _ = FORMATS[fmt]
    return [c for c in (*required, *optional) if c in columns]


# ------------------------------------------------------------------------------------------ rows


def to_example(row: dict[str, Any], fmt: str) -> Example:
    """One row of a detected format as an Example; raises ValueError saying what is wrong (a blank chosen answer or
    feedback completion included: it would train as an end-of-sequence token alone, as a blank prompt is refused)."""
    example = to_feedback(row) if fmt == "feedback" else to_pair(row, fmt)
    if not example.chosen.strip():
        what = "the completion" if fmt == "feedback" else "the chosen answer"
        raise ValueError(f"{what} is blank: there is no answer to learn (it would train as an end-of-sequence token "
                         "alone); drop the row or give the answer")
    return example


def to_pair(row: dict[str, Any], fmt: str) -> Example:
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if fmt == "implicit" or (fmt == "explicit" and _full_conversations(chosen, rejected)):
        return _implicit(chosen, rejected)
    if fmt == "sharegpt":
        turns = _list(row.get("conversations"), "conversations")
        return _conversational("sharegpt", turns, _turn(chosen, "chosen"), _turn(rejected, "rejected"))
    if fmt == "alpaca":  # the prompt as SFT's Alpaca rows (instruction + input)
        a = formats_.to_messages({**row, "output": _text(chosen, "chosen")}, "alpaca")
        b = formats_.to_messages({**row, "output": _text(rejected, "rejected")}, "alpaca")
        return Example(a[:-1], a[-1]["content"], b[-1]["content"])
    if fmt == "explicit":
        prompt = row.get("prompt")
        if isinstance(prompt, str):
            return _textual(prompt, chosen, rejected)
        return _conversational("messages", _list(prompt, "prompt"), _turn(chosen, "chosen", CHAT),
                               _turn(rejected, "rejected", CHAT))
    raise ValueError(f"unknown preference format {fmt!r}")


def to_feedback(row: dict[str, Any]) -> Example:
    desirable = _bool_label(row.get("label"))
    if desirable is None:
        raise ValueError(f"'label' is {row.get('label')!r}; feedback labels are true / false (or 1 / 0, as numbers "
                         "or text)")
    if row.get("messages") is not None and row.get("completion") is None:
        full = _chat("messages", _list(row["messages"], "messages"))
        return Example(full[:-1], _reply(full, "the last turn of messages"), desirable=desirable)
    prompt, completion = row.get("prompt"), row.get("completion")
    if isinstance(prompt, str):
        return dataclasses.replace(_textual(prompt, completion), desirable=desirable)
    full = _chat("messages", [*_list(prompt, "prompt"), _turn(completion, "completion", CHAT)])
    return Example(full[:-1], _reply(full, "completion"), desirable=desirable)


def _textual(prompt: str, *responses: Any) -> Example:
    """A text prompt and its responses (texts, or one assistant turn each), checked as SFT's prompt / completion."""
    texts = [r if isinstance(r, str) else _reply(_chat("messages", [_turn(r, name, CHAT)]), name)
             for r, name in zip(responses, ("chosen", "rejected") if len(responses) == 2 else ("completion",))]
    for text in texts:
        formats_.to_messages({"prompt": prompt, "completion": text}, "prompt_completion")
    return Example(prompt, *texts)


def _conversational(fmt: str, turns: list, chosen: dict, rejected: dict) -> Example:
    """A prompt of turns and the two reply turns, each conversation read as SFT reads ``fmt`` rows."""
    a = _chat(fmt, [*turns, chosen])
    b = _chat(fmt, [*turns, rejected])
    return Example(a[:-1], _reply(a, "chosen"), _reply(b, "rejected"))


def _full_conversations(chosen: Any, rejected: Any) -> bool:
    """Explicit-prompt rows whose chosen / rejected hold the whole conversation again (UltraFeedback's layout)."""
    return all(isinstance(v, list) and any(isinstance(t, dict) and t.get("role") != "assistant" for t in v)
               for v in (chosen, rejected))


def _implicit(chosen: Any, rejected: Any) -> Example:
    """The prompt of two full transcripts: their common prefix, cut at its last assistant turn."""
    if isinstance(chosen, str) and isinstance(rejected, str):
        common = os.path.commonprefix([chosen, rejected])
        k = common.rfind(HH_ASSISTANT)
        if k < 0:
            raise ValueError(f"chosen and rejected share no prompt ending in {HH_ASSISTANT!r} (the prompt is the "
                             "common beginning of the two transcripts, cut after its last assistant turn)")
        k += len(HH_ASSISTANT)
        return Example(chosen[:k], chosen[k:], rejected[k:])
    if not isinstance(chosen, list) or not isinstance(rejected, list):
        raise ValueError(f"chosen and rejected are {type(chosen).__name__} and {type(rejected).__name__}; "
                         "expected two texts or two message lists")
    a, b = _chat("messages", chosen), _chat("messages", rejected)
    p = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if a == b:  # the same conversation twice: a tie, cut at its last assistant turn
        p = max(i for i, m in enumerate(a) if m["role"] == "assistant")
    for name, conv in (("chosen", a), ("rejected", b)):
        rest = conv[p:]
        if len(rest) != 1 or rest[0]["role"] != "assistant":
            raise ValueError(f"no common prompt: {name} differs from the other at turn {p + 1}, which is not its "
                             "last turn and reply (the prompt is the common beginning, cut at the last assistant "
                             "turn)")
    return Example(a[:p], a[p]["content"], b[p]["content"])


def _chat(fmt: str, turns: list) -> list[dict[str, str]]:
    """Turns checked and mapped as SFT's ``messages`` / ``sharegpt`` rows (roles, contents)."""
    return formats_.to_messages({"messages" if fmt == "messages" else "conversations": turns}, fmt)


def _list(value: Any, name: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{name!r} is {'missing' if value is None else type(value).__name__}, not a list of turns")
    return value


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name!r} is {'missing' if value is None else type(value).__name__}, not text")
    return value


def _turn(value: Any, name: str, keys: str = "{from, value}") -> dict:
    """A response turn: one dict (or a list holding one); a text is the assistant's turn ({role, content} rows)."""
    if isinstance(value, str) and keys == CHAT:
        return {"role": "assistant", "content": value}
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, dict):
        raise ValueError(f"{name!r} is {'missing' if value is None else type(value).__name__}, not one {keys} turn"
                         + (" or a text" if keys == CHAT else ""))
    return value


def _reply(messages: list[dict[str, str]], name: str) -> str:
    if messages[-1]["role"] != "assistant":
        raise ValueError(f"{name} is a {messages[-1]['role']} turn, not the assistant's reply")
    return messages[-1]["content"]


def hh_messages(text: str) -> list[dict[str, str]] | None:
    """An HH-RLHF transcript ('\\n\\nHuman: ... \\n\\nAssistant: ...') as messages (the last assistant turn may be
    empty: the prompt), or None when the text is not one."""
    if not text.startswith(HH_HUMAN):
        return None
    parts = re.split(r"\n\n(Human|Assistant):", text)[1:]
    out = [{"role": "user" if who == "Human" else "assistant", "content": said.strip()}
           for who, said in zip(parts[::2], parts[1::2])]
    return out[:-1] if out and out[-1]["role"] == "assistant" and not out[-1]["content"] else out


def check_rows(ds, fmt: str, where: str, limit: int = 5, name_row=None) -> list[str]:  # noqa: ANN001
    """Problems of the rows of a detected format, at most ``limit`` listed (``name_row(i)``: a file line)."""
    return formats_.check_rows(ds, fmt, where, limit, name_row, convert=to_example)
