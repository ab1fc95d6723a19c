"""What the loss covers in a rendered row (``rendering.render``: token ids and the is-response mask), checked before
training: the empty ``<think></think>`` blocks a template inserts are not learnt (``data.train_on_empty_think``);
the first rows' masks must hold a token to learn and end with the end-of-turn the template closes a reply with
(the EOS for the plain template and prompt + completion rows), and a prompt to be answered (GRPO) must end with
what the template opens the assistant's turn with. ``marked`` shows a row with its trained spans in [[...]] (the
log's rendered example, ``leantrain inspect --render``).

The end-of-turn and the opening are not names: they are found by rendering a tiny conversation through the
template (``closing``, ``opening``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from leantrain.data.lm.rendering import Rendering, describe
from leantrain.errors import UserError

FIRST_ROWS = 8  # rows of the training data rendered and checked before any model loads
EMPTY_THINK = re.compile(r"<think>\s*</think>\s*")
_PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
FIX_EMPTY = ("use data.template=plain, or a chat template with {% generation %} ... {% endgeneration %} around each "
             "assistant reply")


# ------------------------------------------------------------------------------------------ the mask


def runs(mask: list[bool]) -> list[tuple[int, int]]:
    """(start, end) of each run of True in ``mask``."""
    out, start = [], None
    for i, m in enumerate([*mask, False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def pieces(ids: list[int], tokenizer) -> list[str]:  # noqa: ANN001
    """Each token's text (special tokens as written), in one call of a fast tokenizer's backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.decode_batch([[t] for t in ids], skip_special_tokens=False)
    return [tokenizer.decode([t], skip_special_tokens=False) for t in ids]


def without_empty_think(ids: list[int], mask: list[bool], tokenizer) -> list[bool]:  # noqa: ANN001
    """``mask`` with the tokens of each empty think block (``<think>``, whitespace, ``</think>`` and the whitespace
    after it) inside a trained span set to False: a template that inserts one before every reply (Qwen3's) would
    otherwise teach the model to skip its reasoning. A token that also holds text of the reply stays trained."""
    out = list(mask)
    for start, end in runs(mask):
        if "<think>" not in tokenizer.decode(ids[start:end], skip_special_tokens=False):
            continue
        texts = pieces(ids[start:end], tokenizer)
        edges = [0]
        for t in texts:
            edges.append(edges[-1] + len(t))
        for m in EMPTY_THINK.finditer("".join(texts)):
            for k in range(len(texts)):
                if m.start() <= edges[k] and edges[k + 1] <= m.end() and edges[k + 1] > edges[k]:
                    out[start + k] = False
    return out


def marked(ids: list[int], trained: list[bool], tokenizer, open_mark: str = "[[",  # noqa: ANN001
           close_mark: str = "]]") -> str:
    """The row as text with the trained spans in [[...]]."""
    out, i = [], 0
    while i < len(ids):
        j = i
        while j < len(ids) and trained[j] == trained[i]:
            j += 1
        piece = tokenizer.decode(ids[i:j], skip_special_tokens=False)
        out.append(f"{open_mark}{piece}{close_mark}" if trained[i] else piece)
        i = j
    return "".join(out)


# ------------------------------------------------------------------------------------------ the template's edges


def closing(tokenizer, rendering: Rendering) -> str | None:  # noqa: ANN001
    """The text that ends a reply: the EOS (plain template, prompt + completion rows), or for a chat template what
    it writes after an assistant turn's content (stripped: ``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``); ""
    when it writes nothing; None when it cannot be told (no EOS, a template that refuses the probe)."""
    if not rendering.chat:
        return tokenizer.eos_token or None
    try:
        text = tokenizer.apply_chat_template(_PROBE, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that needs more than the probe: nothing to compare with
        return None
    at = text.rfind(_PROBE[-1]["content"])
    return text[at + len(_PROBE[-1]["content"]):].strip() if at >= 0 else None


def opening(tokenizer) -> str | None:  # noqa: ANN001
    """What the chat template writes to open the assistant's turn (``add_generation_prompt``), or None."""
    try:
        bare = tokenizer.apply_chat_template(_PROBE[:1], tokenize=False)
        opened = tokenizer.apply_chat_template(_PROBE[:1], tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that needs more than the probe
        return None
    return opened[len(bare):] if opened.startswith(bare) and len(opened) > len(bare) else None


# ------------------------------------------------------------------------------------------ rendered rows, checked


@dataclass
class RenderedRow:
    """One row as the model sees it: ``source`` names the file (``data.train: a.jsonl``), ``row`` the row in it
    (``line 3``), ``part`` which sequence of the row (``chosen``, ``rejected``, ``prompt``; "" for the one),
    ``trained`` the tokens the loss covers. ``kind``: ``response`` (a reply is learnt: checked for an empty mask and
    its end-of-turn), ``prompt`` (nothing is trained: checked to end with the template's opening of the assistant's
    turn), ``all`` (every token is trained, data.train_on_prompt: nothing to check). ``problem``: why it could not be
    rendered."""

    source: str
    row: str
    rendering: Rendering
    ids: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    part: str = ""
    kind: str = "response"
    problem: str | None = None

    @property
    def name(self) -> str:
        return f"{self.source}: {self.row}" + (f" ({self.part})" if self.part else "")


def unrendered(source: str, row: str, rendering: Rendering, err: Exception, part: str = "") -> RenderedRow:
    """A row its template failed on (a Jinja error, a template that rewrites earlier turns), with why."""
    why = str(err) if isinstance(err, (ValueError, UserError)) else f"{type(err).__name__}: {err}"
    return RenderedRow(source, row, rendering, part=part, problem=why)


def row_problem(row: RenderedRow, tokenizer, end: str | None, opener: str | None) -> str | None:  # noqa: ANN001
    """What is wrong with one rendered row (``end``: ``closing``, ``opener``: ``opening``), or None; the message
    does not name the row."""
    source = describe(row.rendering, tokenizer)
    if row.problem:
        return f"{row.problem} (rendered with {source})"
    if row.kind == "prompt":
        return _prompt_problem(row, tokenizer, opener, source)
    if row.kind != "response":
        return None
    spans = runs(row.trained)
    if not spans:
        return f"the assistant mask is empty: {source} marks no token of the reply to learn; {FIX_EMPTY}"
    if end == "":
        return (f"{source} writes nothing after an assistant reply, so no end-of-turn token is learnt and a model "
                "trained on it does not learn to stop; use a template that closes each reply with an end-of-turn "
                "token or the EOS, or data.template=plain (each reply ends with the EOS)")
    start, stop = spans[-1]
    tail = tokenizer.decode(row.ids[start:stop], skip_special_tokens=False).rstrip()
    if end is not None and not tail.endswith(end):
        return (f"the trained tokens end with {tail[-40:]!r}, not with {end!r}, the end-of-turn {source} closes a "
                f"reply with, so a model trained on it does not learn to stop; put {end!r} inside the template's "
                "{% generation %} block, or use data.template=plain (each reply ends with the EOS)")
    return None


def _prompt_problem(row: RenderedRow, tokenizer, opener: str | None, source: str) -> str | None:  # noqa: ANN001
    """A prompt to be answered that does not end with the template's opening of the assistant's turn."""
    text = tokenizer.decode(row.ids, skip_special_tokens=False).rstrip()
    if not (row.rendering.chat and opener and opener.strip()) or text.endswith(opener.strip()):
        return None
    return (f"the prompt ends with {text[-40:]!r}, not with {opener!r}, what {source} opens the assistant's turn "
            "with, so the model would be asked to go on from there; use a template whose {% generation %} block "
            "starts after that opening, or data.template=plain")


def problems(rows: list[RenderedRow], tokenizer) -> list[str]:  # noqa: ANN001
    """The problems of the rendered rows, one line per file, problem and part, naming its rows (nothing when they
    are all as training needs)."""
    edges = {r.rendering: (closing(tokenizer, r.rendering), opening(tokenizer) if r.rendering.chat else None)
             for r in rows}
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        found = row_problem(r, tokenizer, *edges[r.rendering])
        if found:
            grouped.setdefault((r.source, r.part, found), []).append(r.row)
    return [f"{source}: {_rows(names)}{f' ({part})' if part else ''}: {found}"
            for (source, part, found), names in grouped.items()]


def _rows(names: list[str]) -> str:
    """``line 1``, ``line 2`` -> ``lines 1, 2``."""
    words = {n.split(" ", 1)[0] for n in names}
    if len(names) == 1 or len(words) != 1:
        return ", ".join(names)
    return f"{words.pop()}s " + ", ".join(n.split(" ", 1)[1] for n in names)


HINT = "see what the loss covers: leantrain inspect <the same config and keys> --render 3"
