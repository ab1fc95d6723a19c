"""Instruction and chat data for supervised fine-tuning of causal LMs: detect the format, render each conversation
with the tokenizer's chat template (or a plain template), and label only the tokens the model should learn.

Formats (auto-detected from the column names, first match wins):

- ``messages``: a list of ``{role, content}`` (OpenAI); roles system, user, assistant (tool: prompt)
- ``conversations``: a list of ``{from, value}`` (ShareGPT); human -> user, gpt -> assistant, system
- ``instruction`` / ``input`` / ``output`` (Alpaca; ``input`` optional)
- ``instruction`` / ``context`` / ``response`` (Dolly; ``context`` optional)
- ``prompt`` / ``completion``: the two texts joined as they are (no template unless data.template names one)

Rows come out in the causal-LM contract's schema: ``input_ids``, ``labels`` (same length, not shifted, -100 where
there is no target: prompt tokens unless data.train_on_prompt, and always the first token), ``length``, ``targets``
(labels != -100 past the first token: what a shifted loss counts), and ``position_ids`` when packed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import datasets
import numpy as np

from leantrain.data.conversation import (ROLE_ALIASES, row_tools, template_takes_tools, tools_in_system, tools_note,
                                         with_system)
from leantrain.errors import DataError, more_rows, problems_error

IGNORE = -100
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
PLAIN_TEMPLATE = "### Instruction:\n{prompt}\n\n### Response:\n{response}"
TURN_SEPARATOR = "\n\n"
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


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


# ------------------------------------------------------------------------------------------ rendering


@dataclass(frozen=True)
class Rendering:
    """How conversations become text: ``generation`` (chat template with {% generation %}: its assistant mask),
    ``chat`` (chat template, assistant spans from rendering each prefix), ``plain`` (data.template or the default
    plain template), ``raw`` (prompt + completion as they are)."""

    mode: str
    template: str | None = None  # the plain template (mode plain)

    @property
    def chat(self) -> bool:
        """Whether generation should apply the chat template (report.sample_prompts, generate)."""
        return self.mode in ("generation", "chat")


def choose_rendering(tokenizer, template: str, fmt: str) -> Rendering:
    """data.template (``auto`` | ``chat`` | ``plain`` | a template with {prompt} and {response}) -> a Rendering."""
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if template == "chat" or (template == "auto" and has_chat and fmt != "prompt_completion"):
        if not has_chat:
            raise DataError("data.template=chat, but the tokenizer has no chat template; use data.template=auto or "
                            "plain")
        chat_template = tokenizer.chat_template
        tagged = isinstance(chat_template, str) and bool(_GENERATION_TAG.search(chat_template))
        return Rendering("generation" if tagged else "chat")
    if template == "auto" and fmt == "prompt_completion":
        return Rendering("raw")
    if template in ("auto", "plain"):
        return Rendering("plain", PLAIN_TEMPLATE)
    check_template(template)
    return Rendering("plain", template)


PLACEHOLDERS = ("system", "prompt", "response")
_PLACEHOLDER = re.compile(r"\{(\w*)\}")


def check_template(template: str) -> None:
    """A custom data.template: {prompt} once, ending in {response}; {system} optional; no other placeholder."""
    unknown = sorted({f"{{{p}}}" for p in _PLACEHOLDER.findall(template) if p not in PLACEHOLDERS})
    if unknown:
        raise DataError(f"data.template={template!r}: unknown placeholder{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(unknown)}; a template knows {{system}}, {{prompt}} and {{response}}")
    if template.count("{prompt}") != 1 or template.count("{response}") != 1 or not template.endswith("{response}"):
        raise DataError(f"data.template={template!r}: a custom template holds {{prompt}} once and ends with "
                        "{response} (optionally {system}), or is one of auto, chat, plain")


def plain_prompt(prompt: str, template: str, system: str = "") -> str:
    """The text the plain template puts before a response to ``prompt``: what a model trained on it is prompted
    with. ``system``: the conversation's system text, at {system} when the template has it, else before the turn."""
    head, _ = template.split("{response}")
    turn = head.replace("{system}", system).replace("{prompt}", prompt)
    return system + TURN_SEPARATOR + turn if system and "{system}" not in template else turn


def render(messages: list[dict[str, str]], tokenizer, rendering: Rendering,
           tools: list[dict] | None = None) -> tuple[list[int], list[bool]]:
    """(token ids, is-response mask) of one conversation; every assistant turn (and the end-of-turn / EOS after it)
    is marked. ``tools``: the row's tool schemas, for the chat template (``tools=``) or the system message."""
    if tools and not (rendering.chat and template_takes_tools(tokenizer)):
        messages, tools = tools_in_system(messages, tools), None
    if rendering.mode == "generation":
        enc = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, tools=tools,
                                            return_assistant_tokens_mask=True)
        ids = list(enc["input_ids"])
        return ids, [bool(m) for m in enc["assistant_masks"]]
    text, spans, special = _text_spans(messages, tokenizer, rendering, tools)
    return _tokens(text, spans, tokenizer, special)


def _text_spans(messages, tokenizer, rendering: Rendering, tools=None) -> tuple[str, list[tuple[int, int]], bool]:
    """The rendered text, the character spans to learn, whether the tokenizer adds its special tokens."""
    if rendering.mode == "chat":
        return _chat_spans(messages, tokenizer, tools) + (False,)
    eos = tokenizer.eos_token or ""
    if rendering.mode == "raw":
        turns = [m for m in messages if m["role"] != "system"]  # the texts as they are: no system message
        prompt, answer = turns[0]["content"], turns[1]["content"] + eos
        return prompt + answer, [(len(prompt), len(prompt) + len(answer))], True
    text, spans = "", []
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    prompt_parts: list[str] = []
    template = rendering.template or PLAIN_TEMPLATE
    for m in messages:
        if m["role"] == "assistant":
            turn = plain_prompt("\n\n".join(prompt_parts), template, system if not text else "")
            text += (TURN_SEPARATOR if text else "") + turn
            spans.append((len(text), len(text) + len(m["content"]) + len(eos)))
            text += m["content"] + eos
            prompt_parts = []
        elif m["role"] != "system":
            prompt_parts.append(m["content"])
    return text, spans, True


def _chat_spans(messages, tokenizer, tools=None) -> tuple[str, list[tuple[int, int]]]:
    """Assistant spans of a chat template without generation marks: each assistant turn is what rendering the
    conversation through it adds to rendering the conversation before it with the generation prompt."""
    full = tokenizer.apply_chat_template(messages, tokenize=False, tools=tools)
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _generation_prompt(tokenizer, messages[:k], m, tools)
        through = tokenizer.apply_chat_template(messages[: k + 1], tokenize=False, tools=tools)
        if not (through.startswith(before) and full.startswith(through)):
            raise DataError("the tokenizer's chat template does not render a conversation as the extension of its "
                            "beginning (it rewrites earlier turns), so the assistant spans cannot be found; set "
                            "data.template=plain or use a template with {% generation %} marks")
        spans.append((len(before), len(through)))
    return full, spans


def _generation_prompt(tokenizer, messages, first_turn: str, tools=None) -> str:  # noqa: ANN001
    """The conversation so far with the assistant's turn opened. For an assistant turn first (no conversation to
    render before it), what the template writes before the turn's text: whatever precedes its content (a default
    system prompt, the turn's header)."""
    if messages:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, tools=tools)
    content = first_turn["content"]
    through = tokenizer.apply_chat_template([first_turn], tokenize=False, tools=tools)
    at = through.rfind(content) if content else -1
    if at < 0:
        raise DataError("a conversation opens with an empty assistant turn, which the chat template's text cannot "
                        "locate; drop that turn or set data.template=plain")
    return through[:at]


def _tokens(text: str, spans: list[tuple[int, int]], tokenizer, special: bool) -> tuple[list[int], list[bool]]:
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
        mask = [any(s < b and e > a for a, b in spans) for s, e in enc["offset_mapping"]]
        return list(enc["input_ids"]), mask
    # a slow tokenizer has no offsets: tokenise the pieces between span edges separately
    ids: list[int] = list(tokenizer.build_inputs_with_special_tokens([])) if special else []
    mask = [False] * len(ids)
    edges = sorted({0, len(text), *[p for span in spans for p in span]})
    for a, b in zip(edges, edges[1:]):
        piece = tokenizer(text[a:b], add_special_tokens=False)["input_ids"]
        inside = any(s <= a and b <= e for s, e in spans)
        ids += piece
        mask += [inside] * len(piece)
    return ids, mask


# ------------------------------------------------------------------------------------------ rows


def labelled(ids: list[int], mask: list[bool], *, train_on_prompt: bool, block_size: int) -> dict[str, Any] | None:
    """One row of the contract's schema, cut to block_size from the end; its ``truncated`` flag; None when no target
    remains after the cut."""
    truncated = len(ids) > block_size
    ids, mask = ids[:block_size], mask[:block_size]
    labels = list(ids) if train_on_prompt else [t if m else IGNORE for t, m in zip(ids, mask)]
    if labels:
        labels[0] = IGNORE  # never a target: nothing predicts it (and packing must not predict it across examples)
    targets = sum(1 for y in labels if y != IGNORE)
    if targets == 0:
        return None
    return {"input_ids": ids, "labels": labels, "length": len(ids), "targets": targets, "truncated": truncated}


def template_error(err: Exception, tokenizer, where: str) -> DataError:  # noqa: ANN001
    """A Jinja error of the tokenizer's chat template (a syntax error, a ``raise_exception`` call) as exit 2 naming
    the template and ``where`` (the row)."""
    name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
    line = getattr(err, "lineno", None)
    at = f" (template line {line})" if line else ""
    return DataError(f"{where}: the chat template of {name}{at} fails: {type(err).__name__}: {err}; fix the "
                     "template (chat_template in tokenizer_config.json / chat_template.jinja) or set data.template=plain")


def _encode(batch: dict[str, list], indices: list[int], tokenizer, fmt: str, rendering: Rendering,
            train_on_prompt: bool, block_size: int, where: str = "data.train",
            system_prompt: str | None = None) -> dict[str, list]:
    from jinja2 import TemplateError

    out: dict[str, list] = {"input_ids": [], "labels": [], "length": [], "targets": [], "truncated": []}
    n = len(next(iter(batch.values())))
    for i in range(n):
        row = {k: v[i] for k, v in batch.items()}
        try:
            ids, mask = render(to_messages(row, fmt, system_prompt), tokenizer, rendering, row_tools(row))
        except TemplateError as e:
            raise template_error(e, tokenizer, f"{where}: row {indices[i] + 1}") from None
        one = labelled(ids, mask, train_on_prompt=train_on_prompt, block_size=block_size)
        if one is None:
            one = {"input_ids": ids[:block_size], "labels": [IGNORE] * min(len(ids), block_size),
                   "length": min(len(ids), block_size), "targets": 0, "truncated": len(ids) > block_size}
        for k in out:
            out[k].append(one[k])
    return out


@dataclass
class SftData:
    """The processed rows and what processing found (for the log)."""

    dataset: datasets.Dataset
    format: str
    rendering: Rendering
    truncated: int = 0
    dropped: int = 0
    notes: list[str] = field(default_factory=list)


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


def process(ds: datasets.Dataset, tokenizer, *, block_size: int, template: str = "auto",
            train_on_prompt: bool = False, where: str = "data.train", desc: str = "Rendering",
            system_prompt: str | None = None) -> SftData:
    """Rows of an instruction/chat format -> SftData with input_ids, labels, length, targets (cached by datasets)."""
    fmt = detect_format(ds.column_names)
    if fmt is None:
        raise unknown_format(where, ds.column_names)
    problems = check_rows(ds, fmt, where)
    if problems:
        raise problems_error(problems)
    rendering = choose_rendering(tokenizer, template, fmt)
    out = ds.map(_encode, batched=True, batch_size=256, remove_columns=ds.column_names, desc=desc, with_indices=True,
                 fn_kwargs={"tokenizer": tokenizer, "fmt": fmt, "rendering": rendering,
                            "train_on_prompt": train_on_prompt, "block_size": block_size, "where": where,
                            "system_prompt": system_prompt})
    truncated = int(np.sum(out.with_format("numpy")["truncated"])) if len(out) else 0
    targets = np.asarray(out["targets"])
    keep = np.flatnonzero(targets > 0)
    dropped = len(out) - len(keep)
    if dropped:
        out = out.select(keep)
    out = out.remove_columns(["truncated"])
    data = SftData(out, fmt, rendering, truncated, dropped)
    data.notes.append(f"{where}: instruction data, format {FORMATS[fmt][2]}; rendered with "
                      f"{_rendering_name(rendering)}; loss on {'every token' if train_on_prompt else 'responses only'}")
    if "tools" in ds.column_names:
        data.notes.append(tools_note(where, tokenizer, rendering.chat))
    if truncated:
        gone = f"; {dropped} left with no response token were dropped" if dropped else ""
        data.notes.append(f"{where}: {truncated} of {len(ds)} examples longer than data.block_size={block_size} "
                          f"tokens, cut from the end{gone}")
    return data


def _rendering_name(rendering: Rendering) -> str:
    return {"generation": "the tokenizer's chat template (its {% generation %} marks)",
            "chat": "the tokenizer's chat template",
            "raw": "no template (prompt + completion + EOS)"}.get(
        rendering.mode, "the plain template" + (" (data.template)" if rendering.template != PLAIN_TEMPLATE else ""))


def show_example(row: dict[str, Any], tokenizer, open_mark: str = "[[", close_mark: str = "]]") -> str:
    """One processed row as text with the trained spans in [[...]] (what the log prints)."""
    ids, labels = row["input_ids"], row["labels"]
    out, i = [], 0
    while i < len(ids):
        j = i
        target = labels[i] != IGNORE
        while j < len(ids) and (labels[j] != IGNORE) == target:
            j += 1
        piece = tokenizer.decode(ids[i:j], skip_special_tokens=False)
        out.append(f"{open_mark}{piece}{close_mark}" if target else piece)
        i = j
    return "".join(out)


# ------------------------------------------------------------------------------------------ packing


@dataclass
class Packed:
    dataset: datasets.Dataset
    examples: int
    blocks: int
    padding_before: int  # pad tokens when every example is a row padded to block_size
    padding_after: int  # pad tokens when every block is padded to block_size

    def note(self, block_size: int) -> str:
        saved = self.padding_before - self.padding_after
        tokens = self.blocks * block_size - self.padding_after
        fill = tokens / max(self.blocks * block_size, 1)
        return (f"data.packing: {self.examples} examples packed into {self.blocks} blocks of <= {block_size} tokens "
                f"({self.examples / max(self.blocks, 1):.1f} per block, {fill:.0%} full; positions restart per "
                f"example, no attention across examples); padding saved: {saved:,} tokens against every example "
                f"padded to data.block_size (length-grouped batches of single examples pad less than that)")


def pack_order(lengths: Sequence[int], block_size: int) -> list[list[int]]:
    """First-fit decreasing: groups of example indices whose lengths sum to <= block_size. Deterministic."""
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order.tolist():
        n = int(lengths[i])
        for b, r in enumerate(room):
            if n <= r:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(block_size - n)
    return bins


def pack(ds: datasets.Dataset, block_size: int) -> Packed:
    """Processed SFT rows -> blocks of several examples: input_ids and labels concatenated, position_ids restarting
    at 0 per example (the model's packed-sequence mask keeps attention inside each example), length and targets
    summed. Each example's first label is already -100, so no target crosses an example boundary."""
    cols = ds.with_format(None)[:]
    lengths = cols["length"]
    groups = pack_order(lengths, block_size)
    rows: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": [], "length": [], "targets": []}
    for g in groups:
        ids, labels, pos = [], [], []
        for i in g:
            ids += cols["input_ids"][i]
            labels += cols["labels"][i]
            pos += list(range(lengths[i]))
        rows["input_ids"].append(ids)
        rows["labels"].append(labels)
        rows["position_ids"].append(pos)
        rows["length"].append(len(ids))
        rows["targets"].append(int(sum(cols["targets"][i] for i in g)))
    packed = datasets.Dataset.from_dict(rows)
    before = len(lengths) * block_size - int(np.sum(lengths))
    after = len(groups) * block_size - int(np.sum(lengths))
    return Packed(packed, len(lengths), len(groups), before, after)
