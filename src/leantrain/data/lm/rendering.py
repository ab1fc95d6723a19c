"""Rendering a conversation to tokens: the tokenizer's chat template (its ``{% generation %}`` marks, or the spans
found by rendering each prefix), the plain template (``data.template``) or the raw prompt + completion; and the
labelled row: only the tokens the model should learn (the responses, unless data.train_on_prompt) are targets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from leantrain.data.lm.conversation import placed_tools
from leantrain.errors import DataError

IGNORE = -100
PLAIN_TEMPLATE = "### Instruction:\n{prompt}\n\n### Response:\n{response}"
TURN_SEPARATOR = "\n\n"
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


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


def describe(rendering: Rendering, tokenizer=None) -> str:  # noqa: ANN001
    """How rows are rendered, for the log and the messages: the template and where it comes from (the tokenizer's
    chat template, named when ``tokenizer`` is given; the plain template; data.template; none)."""
    of = f" of {getattr(tokenizer, 'name_or_path', '') or 'the tokenizer'}" if tokenizer is not None else ""
    if rendering.mode == "generation":
        return f"the tokenizer's chat template{of} (its {{% generation %}} marks)"
    if rendering.mode == "chat":
        return f"the tokenizer's chat template{of}"
    if rendering.mode == "raw":
        return "no template (prompt + completion + EOS)"
    custom = rendering.template not in (None, PLAIN_TEMPLATE)
    return f"the plain template (data.template={rendering.template!r})" if custom and tokenizer is not None else \
        "the plain template" + (" (data.template)" if custom else "")


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
           tools: list[dict] | None = None, how: str = "") -> tuple[list[int], list[bool]]:
    """(token ids, is-response mask) of one conversation; every assistant turn (and the end-of-turn / EOS after it)
    is marked. ``tools``: the row's tool schemas, for the chat template (``tools=``) or the system message (with
    ``how``: how to call them, ``conversation.placed_tools``)."""
    messages, tools = placed_tools(messages, tools, tokenizer, rendering.chat, how)
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
