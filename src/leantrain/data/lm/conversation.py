"""What a conversation carries besides its turns: the system prompt (a row's ``system`` column, else
``data.system_prompt``), the tool schemas of tool-calling data (a row's ``tools``: a JSON list of function
schemas, as LLaMA-Factory's ShareGPT files and OpenAI's API carry them), and the role names other tools use for
tool calls (``function_call`` -> assistant, ``observation`` -> tool).

Tools reach the prompt as ``tokenizer.apply_chat_template(messages, tools=...)`` does when the chat template reads
``tools``; a template that ignores them (SmolLM2's) or the plain template gets them in the system message instead,
so that the schemas are never dropped silently."""

from __future__ import annotations

import json
from typing import Any

EXTRA_COLUMNS = ("system", "tools")  # kept beside any format's own columns
ROLE_ALIASES = {"function_call": "assistant",  # LLaMA-Factory's ShareGPT: the model's tool call (trained)
                "observation": "tool",  # LLaMA-Factory's ShareGPT: the tool's answer (prompt)
                "function": "tool"}  # OpenAI's older role for a function's answer
TOOLS_HEADER = "You can call these tools (JSON schemas, one per line):"


def row_tools(row: dict[str, Any]) -> list[dict] | None:
    """The row's ``tools`` (a JSON string or a list of schemas), or None; raises ValueError saying what is wrong."""
    tools = row.get("tools")
    if tools is None or (isinstance(tools, str) and not tools.strip()):
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError as e:
            raise ValueError(f"'tools' is not valid JSON ({e})") from None
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("'tools' is not a list of function schemas ({\"name\", \"description\", \"parameters\"})")
    return [_without_none(t) for t in tools] or None


def _without_none(value):  # noqa: ANN001, ANN202
    """A schema without the None fields Arrow fills in when rows' schemas have different keys (JSONL lists)."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def with_system(messages: list[dict[str, str]], row: dict[str, Any], system_prompt: str | None
                ) -> list[dict[str, str]]:
    """``messages`` opened by a system turn: the row's ``system`` column, else ``system_prompt``, unless the
    conversation has its own system turn (or neither is set)."""
    own = row.get("system")
    system = own if isinstance(own, str) and own.strip() else system_prompt
    if not system or (messages and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": system}, *messages]


def template_takes_tools(tokenizer) -> bool:  # noqa: ANN001
    """Whether the tokenizer's chat template reads a ``tools`` variable."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def tools_in_system(messages: list[dict[str, str]], tools: list[dict], how: str = "") -> list[dict[str, str]]:
    """The tool schemas written into the system turn (appended to it, or a system turn of their own); ``how``: how to
    call them (a prompt to be answered with tool calls: ``environments.call_format``), after the schemas."""
    text = TOOLS_HEADER + "\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + (f"\n\n{how}" if how
                                                                                                 else "")
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def placed_tools(messages: list[dict[str, str]], tools: list[dict] | None, tokenizer, chat: bool,  # noqa: ANN001
                 how: str = "") -> tuple[list[dict[str, str]], list[dict] | None]:
    """(messages, tools for the chat template): the schemas as ``tools=`` where the chat template (``chat``: it
    renders the conversation) reads them, else written into the system message (``tools_in_system``, with ``how``)."""
    if not tools or (chat and template_takes_tools(tokenizer)):
        return messages, tools or None
    return tools_in_system(messages, tools, how), None


def prompt_context(tokenizer, system_prompt: str | None, tools: list[dict] | None,  # noqa: ANN001
                   chat: bool) -> tuple[str | None, list[dict] | None]:
    """(the system text, the tools for the chat template) around one user turn, as training renders a row with this
    system prompt and these tool schemas: ``with_system``, then ``tools_in_system`` unless the chat template reads
    ``tools`` (``chat``: whether the chat template renders the turn)."""
    messages = with_system([], {}, system_prompt)
    if tools and not (chat and template_takes_tools(tokenizer)):
        messages, tools = tools_in_system(messages, tools), None
    return (messages[0]["content"] if messages else None), tools


def tools_note(where: str, tokenizer, chat: bool) -> str:  # noqa: ANN001
    """What happens to the rows' tool schemas, for the log."""
    if chat and template_takes_tools(tokenizer):
        return f"{where}: tool schemas (column tools) passed to the chat template (apply_chat_template(tools=...))"
    return (f"{where}: tool schemas (column tools) written into each row's system message: "
            f"{'the chat template does not read tools' if chat else 'the plain template has no place for them'}")
