"""The tool calls in a completion's text, in the format the model's chat template teaches it.

- ``hermes`` (Qwen2.5, Qwen3, Hermes, SmolLM3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one
  block per call (a block may also hold a JSON list of calls); text around the blocks is left alone.
- ``llama`` (Llama 3.1, 3.2): the whole completion is ``{"name": ..., "parameters": {...}}``, after an optional
  ``<|python_tag|>``; several calls are separated by ``;``. A completion that does not start with ``{`` holds none.
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list ``[{"name": ..., "arguments": {...}}]`` (Mistral 7B v0.3, Nemo),
  or ``[TOOL_CALLS]name[ARGS]{...}`` per call (the newer tokenizers).

Either key, ``arguments`` or ``parameters``, is read in every format, and arguments written as a JSON string that
holds an object are decoded. A completion without a call gives ``[]``; a call that is there but broken (JSON that
does not parse, no name, arguments that are not an object, an unclosed ``<tool_call>``) raises MalformedToolCall,
whose message says what is wrong and shows the expected form: the environment hands it to the model as the tool's
answer. ``template_format`` reads which format a chat template writes; a template with none (SmolLM2's plain ChatML)
gets ``call_format``'s instruction in the system message beside the tool schemas.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

FORMATS = ("hermes", "llama", "mistral")
FALLBACK_FORMAT = "hermes"  # the format leantrain writes into the system message where a template has none
EXPECTED = {"hermes": '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>',
            "llama": '{"name": "<tool name>", "parameters": {<arguments as JSON>}}',
            "mistral": '[TOOL_CALLS][{"name": "<tool name>", "arguments": {<arguments as JSON>}}]'}
HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
LLAMA_ENDS = ("<|eom_id|>", "<|eot_id|>")  # end-of-turn tokens when a completion is decoded with its special tokens


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)


class MalformedToolCall(ValueError):
    """A tool call the completion wrote but that cannot be read; the message shows the expected form."""

    def __init__(self, problem: str, fmt: str):
        super().__init__(f"malformed tool call: {problem}; write a call as {EXPECTED[fmt]}")


def template_format(chat_template: str | None) -> str | None:
    """The tool-call format a chat template writes (one of FORMATS), or None when it has none."""
    if not isinstance(chat_template, str):
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<|python_tag|>" in chat_template or all(s in chat_template for s in ("tools", '"parameters"', "ipython")):
        return "llama"
    return None


def call_format(fmt: str) -> str:
    """The instruction that teaches a model ``fmt``'s tool calls, for a chat template that writes none."""
    after = "the result comes back in the next message. When you know the answer, reply without a tool call."
    how = {"hermes": f"write {EXPECTED['hermes']} and end your turn",
           "llama": f"reply with only {EXPECTED['llama']}, nothing else, and end your turn",
           "mistral": f"write {EXPECTED['mistral']} and end your turn"}
    return f"To call a tool, {how[_checked(fmt)]}; {after}"


def parse_tool_calls(text: str, fmt: str) -> list[ToolCall]:
    """The tool calls in ``text`` written in ``fmt``: ``[]`` when there is none; MalformedToolCall for a broken one."""
    return {"hermes": _hermes, "llama": _llama, "mistral": _mistral}[_checked(fmt)](text)


def _checked(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"no tool-call format {fmt!r}; the formats: {', '.join(FORMATS)}")
    return fmt


def _hermes(text: str) -> list[ToolCall]:
    calls = []
    for body in HERMES_BLOCK.findall(text):
        calls += _calls(_json(body, "hermes"), "hermes")
    if "<tool_call>" in HERMES_BLOCK.sub("", text):
        raise MalformedToolCall("a <tool_call> block is not closed by </tool_call>", "hermes")
    return calls


def _llama(text: str) -> list[ToolCall]:
    text = text.strip()
    text = text.removeprefix("<|python_tag|>").strip()
    for end in LLAMA_ENDS:
        text = text.removesuffix(end).rstrip()
    if not text.startswith("{"):
        return []
    decoder, calls, at = json.JSONDecoder(), [], 0
    while True:
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError as e:
            raise MalformedToolCall(f"not valid JSON ({e})", "llama") from None
        calls += _calls(value, "llama")
        rest = text[at:].lstrip()
        if not rest or rest == ";":
            return calls
        if not rest.startswith(";"):
            raise MalformedToolCall(f"text after the call's JSON: {rest[:40]!r} (several calls are separated by ;)",
                                    "llama")
        at = len(text) - len(rest[1:].lstrip())


def _mistral(text: str) -> list[ToolCall]:
    calls = []
    for part in text.split("[TOOL_CALLS]")[1:]:
        part = part.strip()
        if part.startswith(("[", "{")):  # a JSON list of calls (v3), text after it (</s>) left alone
            try:
                value, _ = json.JSONDecoder().raw_decode(part)
            except ValueError as e:
                raise MalformedToolCall(f"not valid JSON ({e})", "mistral") from None
            calls += _calls(value, "mistral")
        else:  # NAME[ARGS]{...}
            name, sep, arguments = part.partition("[ARGS]")
            if not sep:
                raise MalformedToolCall(f"[TOOL_CALLS] is followed by {part[:40]!r}, not a JSON list", "mistral")
            try:
                value, _ = json.JSONDecoder().raw_decode(arguments.strip())
            except ValueError as e:
                raise MalformedToolCall(f"the arguments of {name.strip()!r} are not valid JSON ({e})",
                                        "mistral") from None
            calls += _calls({"name": name.strip(), "arguments": value}, "mistral")
    return calls


def _json(body: str, fmt: str) -> object:
    try:
        return json.loads(body)
    except ValueError as e:
        raise MalformedToolCall(f"not valid JSON ({e}): {body.strip()[:80]!r}", fmt) from None


def _calls(value: object, fmt: str) -> list[ToolCall]:
    """One call object, or a list of them, as ToolCalls."""
    if isinstance(value, list):
        return [call for item in value for call in _calls(item, fmt)]
    if not isinstance(value, dict):
        raise MalformedToolCall(f"a JSON {type(value).__name__}, not an object with a name and arguments", fmt)
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        raise MalformedToolCall(f"no tool name in {json.dumps(value)[:80]}", fmt)
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI's form: the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass  # left a str: refused below
    if not isinstance(arguments, dict):
        raise MalformedToolCall(f"the arguments of {name!r} are a {type(arguments).__name__}, not a JSON object",
                                fmt)
    return [ToolCall(name.strip(), arguments)]
