"""The environment's messages of a multi-turn episode as tokens, appended after the model's own (token-in/token-out:
the model's sampled ids are kept as they are, never decoded and tokenized again; only the environment's text is
tokenized, once).

The chat template says what text comes between the model's turn and its next one: ``P``, the conversation rendered
through the model's turn (the assistant message holding the completion's text), and ``Q``, the same conversation
with the environment's new messages and the next assistant turn opened (``add_generation_prompt``). ``Q`` must start
with ``P`` (a template that rewrites earlier turns cannot be continued token by token: a UserError naming it). The
environment's text is what ``P`` has after the completion's text, less the stop token the model ended with (ChatML's
``<|im_end|>``: the model wrote it; the newline after it is the template's), then ``Q[len(P):]``: the tool results
and the opening of the model's next turn. Special tokens in it (``<|im_start|>``) are read as such.
"""

from __future__ import annotations

from leantrain.data.lm.conversation import placed_tools, template_takes_tools
from leantrain.environments import FALLBACK_FORMAT as FALLBACK
from leantrain.environments import call_format, template_format
from leantrain.errors import UserError


def tool_format(tokenizer) -> str:  # noqa: ANN001
    """The tool-call format the episode's completions are parsed in: the chat template's own where it reads ``tools``
    (``environments.template_format``), else leantrain's ``FALLBACK``, written into the system message with the
    schemas (``how_to_call``). A template that reads tools in a format leantrain does not parse is a UserError."""
    if not template_takes_tools(tokenizer):
        return FALLBACK
    found = template_format(tokenizer.chat_template)
    if found is None:
        name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
        raise UserError(f"the chat template of {name} reads tools, but writes tool calls in a format leantrain does "
                        "not parse (it reads <tool_call>{...}</tool_call> (Hermes, Qwen), Llama 3's JSON calls and "
                        "Mistral's [TOOL_CALLS]); use a template with one of these (docs/environments.md)")
    return found


def how_to_call(tokenizer) -> str:  # noqa: ANN001
    """The call instruction written with the schemas into the system message ("" where the template reads tools)."""
    return "" if template_takes_tools(tokenizer) else call_format(FALLBACK)


def environment_ids(tokenizer, messages: list[dict], completion: str, stop_text: str, new: list[dict],  # noqa: ANN001
                    tools: list[dict] | None) -> list[int]:
    """The token ids between the model's turn (``completion``, ended by ``stop_text``: the decoded stop token it
    sampled, "" when none) and its next: the template's close of the turn, the environment's ``new`` messages, the
    opening of the next assistant turn. ``messages``: the conversation before the model's turn."""
    shown, tools = placed_tools(messages, tools, tokenizer, True, how_to_call(tokenizer))
    turn = [*shown, {"role": "assistant", "content": completion}]
    before = tokenizer.apply_chat_template(turn, tokenize=False, tools=tools)
    after = tokenizer.apply_chat_template([*turn, *new], tokenize=False, tools=tools, add_generation_prompt=True)
    at = before.rfind(completion) if completion else len(before)
    if not after.startswith(before) or at < 0:
        name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
        raise UserError(f"the chat template of {name} rewrites the conversation when a turn is added (the rendering "
                        "through the model's turn is not the start of the rendering with the environment's messages), "
                        "so an episode cannot be continued token by token; use a template that appends turns "
                        "(ChatML, Llama 3, Qwen 2.5)")
    close = before[at + len(completion):]
    if stop_text and close.startswith(stop_text):
        close = close[len(stop_text):]
    return list(tokenizer(close + after[len(before):], add_special_tokens=False)["input_ids"])
