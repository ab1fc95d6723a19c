"""The environment's reply between two of the model's turns (``env_tokens``): the model's tokens are kept as sampled
and only the reply is tokenized, and the episode's tokens are then the chat template's rendering of the whole
conversation; a template that reads tools keeps its own call format, one that does not gets the schemas and the Hermes
call format in the system message."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from leantrain.environments import call_format
from leantrain.errors import UserError
from leantrain.methods.grpo.env_tokens import environment_ids, tool_format
from tests.helpers import CHATML, make_tiny_chat_tokenizer

SCHEMA = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(make_tiny_chat_tokenizer(tmp_path_factory.mktemp("tok"), chat_template=CHATML))


def test_prompt_model_turn_and_reply_are_the_rendering_of_the_whole_conversation(tok):
    opening = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    completion = '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
    new = [{"role": "tool", "content": "5"}]
    prompt = tok.apply_chat_template(opening, tokenize=False, add_generation_prompt=True)
    model = tok(completion + "<|im_end|>", add_special_tokens=False)["input_ids"]  # as sampled, ending its turn
    reply = environment_ids(tok, opening, completion, "<|im_end|>", new, None)
    assert tok.decode(reply) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    whole = tok.apply_chat_template([*opening, {"role": "assistant", "content": completion}, *new], tokenize=False,
                                    add_generation_prompt=True)
    ids = tok(prompt, add_special_tokens=False)["input_ids"] + model + reply
    assert tok.decode(ids) == whole


def test_tools_go_into_the_system_message_with_the_call_format_where_the_template_has_none(tok):
    assert tool_format(tok) == "hermes"
    opening = [{"role": "user", "content": "What is 2 + 3?"}]
    reply = environment_ids(tok, opening, "5", "<|im_end|>", [{"role": "user", "content": "Sure?"}], SCHEMA)
    assert tok.decode(reply) == "\n<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n"
    from leantrain.data.lm.conversation import placed_tools

    messages, tools = placed_tools(opening, SCHEMA, tok, True, call_format("hermes"))
    assert tools is None and '"name": "add"' in messages[0]["content"] and "<tool_call>" in messages[0]["content"]


def test_a_template_that_reads_tools_keeps_its_format_and_an_unknown_one_is_named(tok):
    hermes = CHATML.replace("{% for m", "{% if tools %}<tool_call>{% endif %}{% for m")
    tok.chat_template = hermes
    assert tool_format(tok) == "hermes"
    tok.chat_template = CHATML.replace("{% for m", "{% if tools %}TOOLS{% endif %}{% for m")
    with pytest.raises(UserError, match="reads tools, but writes tool calls in a format leantrain does not parse"):
        tool_format(tok)
    tok.chat_template = CHATML


def test_a_template_that_rewrites_earlier_turns_is_named(tok):
    tok.chat_template = ("{% for m in messages %}{% if loop.last %}{{ m['content'] }}{% endif %}{% endfor %}"
                         "{% if add_generation_prompt %}>{% endif %}")
    try:
        with pytest.raises(UserError, match="rewrites the conversation"):
            environment_ids(tok, [{"role": "user", "content": "hi"}], "yo", "", [{"role": "tool", "content": "5"}],
                            None)
    finally:
        tok.chat_template = CHATML
