"""Tool calls in a completion's text (leantrain.environments.tool_calls): each chat template's format read, several
calls at once, arguments as a JSON string, no call as [], a broken call as MalformedToolCall showing the expected
form, and the format read from a chat template."""

from __future__ import annotations

import pytest

from leantrain.environments import MalformedToolCall, ToolCall, call_format, parse_tool_calls, template_format
from leantrain.environments.tool_calls import EXPECTED, FORMATS

ADD = ToolCall("add", {"a": 1, "b": 2})


@pytest.mark.parametrize("text", [
    'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
    '<tool_call>{"name": "add", "parameters": {"a": 1, "b": 2}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>',
])
def test_hermes_one_call(text):
    assert parse_tool_calls(text, "hermes") == [ADD]


def test_hermes_several_calls_and_a_list_body():
    text = ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
            '<tool_call>[{"name": "now"}, {"name": "add", "arguments": {"a": 1, "b": 2}}]</tool_call>')
    assert parse_tool_calls(text, "hermes") == [ADD, ToolCall("now", {}), ADD]


@pytest.mark.parametrize("text, problem", [
    ('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>', "not valid JSON"),
    ('<tool_call>{"arguments": {"a": 1}}</tool_call>', "no tool name"),
    ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "not a JSON object"),
    ('<tool_call>{"name": "add", "arguments": "a=1"}</tool_call>', "not a JSON object"),
    ('<tool_call>"add"</tool_call>', "a JSON str"),
    ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><tool_call>{"name": "add"', "not closed"),
])
def test_hermes_malformed(text, problem):
    with pytest.raises(MalformedToolCall) as e:
        parse_tool_calls(text, "hermes")
    assert problem in str(e.value) and "write a call as <tool_call>{\"name\"" in str(e.value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_call(fmt):
    assert parse_tool_calls("The answer is 3.", fmt) == []


@pytest.mark.parametrize("text", [
    '{"name": "add", "parameters": {"a": 1, "b": 2}}',
    '<|python_tag|>{"name": "add", "arguments": {"a": 1, "b": 2}}<|eom_id|>',
    '  {"name": "add", "parameters": {"a": 1, "b": 2}}\n',
])
def test_llama_one_call(text):
    assert parse_tool_calls(text, "llama") == [ADD]


def test_llama_several_calls():
    text = '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "now", "parameters": {}};'
    assert parse_tool_calls(text, "llama") == [ADD, ToolCall("now", {})]


@pytest.mark.parametrize("text, problem", [
    ('{"name": "add", "parameters": {"a": 1', "not valid JSON"),
    ('{"parameters": {"a": 1}}', "no tool name"),
    ('{"name": "add", "parameters": {}} and then text', "text after the call"),
])
def test_llama_malformed(text, problem):
    with pytest.raises(MalformedToolCall, match=problem):
        parse_tool_calls(text, "llama")


def test_llama_text_that_does_not_open_with_json_is_no_call():
    assert parse_tool_calls('The call would be {"name": "add"}', "llama") == []


@pytest.mark.parametrize("text", [
    '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}]</s>',
    '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}',
])
def test_mistral_one_call(text):
    assert parse_tool_calls(text, "mistral") == [ADD]


def test_mistral_several_calls():
    assert parse_tool_calls('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", '
                            '"arguments": {}}]', "mistral") == [ADD, ToolCall("now", {})]
    assert parse_tool_calls('[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]now[ARGS]{}', "mistral") == [
        ADD, ToolCall("now", {})]


@pytest.mark.parametrize("text, problem", [
    ('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}]', "not valid JSON"),
    ('[TOOL_CALLS] [{"arguments": {"a": 1}}]', "no tool name"),
    ("[TOOL_CALLS] add(1, 2)", "not a JSON list"),
])
def test_mistral_malformed(text, problem):
    with pytest.raises(MalformedToolCall, match=problem):
        parse_tool_calls(text, "mistral")


def test_an_unknown_format():
    with pytest.raises(ValueError, match="hermes, llama, mistral"):
        parse_tool_calls("", "xml")


@pytest.mark.parametrize("template, fmt", [
    ("{%- if tools %}...<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n"
     "</tool_call>{% endif %}", "hermes"),
    ("{%- if message.tool_calls %}[TOOL_CALLS] [{{ tool_calls | tojson }}]{% endif %}", "mistral"),
    ("{%- if builtin_tools %}<|python_tag|>{{ call }}{% endif %}", "llama"),
    ("{%- if tools %}Respond in the format {\"name\": function name, \"parameters\": dictionary}{% endif %}"
     "{% if message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>{% endif %}", "llama"),
    ("{% for message in messages %}<|im_start|>{{ message.role }}\\n{{ message.content }}<|im_end|>\\n"
     "{% endfor %}", None),
    (None, None),
])
def test_template_format(template, fmt):
    assert template_format(template) == fmt


@pytest.mark.parametrize("fmt", FORMATS)
def test_call_format_shows_the_form_the_parser_reads(fmt):
    text = call_format(fmt)
    assert text.startswith("To call a tool, ") and EXPECTED[fmt] in text and "without a tool call" in text
    filled = EXPECTED[fmt].replace('"<tool name>"', '"add"').replace("{<arguments as JSON>}", '{"a": 1, "b": 2}')
    assert parse_tool_calls(filled, fmt) == [ADD]
