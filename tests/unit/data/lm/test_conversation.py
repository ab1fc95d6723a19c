"""What a conversation carries besides its turns: the system prompt (a `system` column, data.system_prompt), tool
schemas (to a chat template that reads `tools`, else into the system message) and other tools' role names."""

from __future__ import annotations

import json

import datasets
import pytest
from transformers import AutoTokenizer

from leantrain.data.lm import instructions as ins
from leantrain.errors import DataError
from tests.helpers import CHATML, make_tiny_chat_tokenizer

TOOLS_CHATML = "{% if tools %}{{ '<|im_start|>tools\n' + (tools | tojson) + '<|im_end|>\n' }}{% endif %}" + CHATML
TOOL = {"name": "get_weather", "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
CALL = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
TOOL_ROW = {"conversations": [{"from": "human", "value": "Weather in Paris?"},
                              {"from": "function_call", "value": CALL},
                              {"from": "observation", "value": "sunny"},
                              {"from": "gpt", "value": "It is sunny."}],
            "tools": json.dumps([TOOL])}


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    root = tmp_path_factory.mktemp("toks")
    return {name: AutoTokenizer.from_pretrained(make_tiny_chat_tokenizer(root / name, chat_template=tpl))
            for name, tpl in (("plain", None), ("chat", CHATML), ("tools", TOOLS_CHATML))}


def text_and_targets(rows, tok, **kw):
    data = ins.process(datasets.Dataset.from_list(rows), tok, block_size=512, **kw)
    row = data.dataset[0]
    shown = ins.show_example(row, tok)
    return tok.decode(row["input_ids"]), [p.split("]]")[0] for p in shown.split("[[")[1:]], data.notes


def test_tools_reach_a_template_that_reads_them_and_the_call_is_trained(toks):
    text, targets, notes = text_and_targets([TOOL_ROW], toks["tools"])
    assert text.startswith("<|im_start|>tools\n[{") and '"get_weather"' in text
    assert "<|im_start|>tool\nsunny<|im_end|>" in text  # observation -> tool (prompt, not trained)
    assert targets[0].startswith(CALL) and targets[1].startswith("It is sunny.") and len(targets) == 2
    assert any("passed to the chat template (apply_chat_template(tools=...))" in n for n in notes)


@pytest.mark.parametrize("tok", ["chat", "plain"])
def test_tools_go_into_the_system_message_when_the_template_ignores_them(tok, toks):
    text, _, notes = text_and_targets([{**TOOL_ROW, "conversations": [{"from": "system", "value": "Be brief."},
                                                                      *TOOL_ROW["conversations"]]}], toks[tok])
    assert "Be brief.\n\nYou can call these tools (JSON schemas, one per line):\n" + json.dumps(TOOL) in text
    assert any("written into each row's system message" in n for n in notes)


def test_an_unknown_role_names_the_mapping(toks):
    row = {"conversations": [{"from": "human", "value": "hi"}, {"from": "robot", "value": "x"},
                             {"from": "gpt", "value": "ok"}]}
    with pytest.raises(DataError, match=r"turn 2: from 'robot' is none of .*function_call.*read as: function_call "
                                        r"-> assistant, observation -> tool"):
        ins.process(datasets.Dataset.from_list([row]), toks["chat"], block_size=64)


def test_bad_tools_are_a_row_problem(toks):
    with pytest.raises(DataError, match=r"row 1: 'tools' is not valid JSON"):
        ins.process(datasets.Dataset.from_list([{**TOOL_ROW, "tools": "[{"}]), toks["chat"], block_size=64)


def test_system_column_and_system_prompt(toks):
    rows = [{"instruction": "What is 2 + 2?", "output": "4", "system": "You are Calc."}]
    text, targets, _ = text_and_targets(rows, toks["chat"], system_prompt="You are Default.")
    assert text.startswith("<|im_start|>system\nYou are Calc.<|im_end|>") and targets == ["4<|im_end|>\n"]
    text, _, _ = text_and_targets([{**rows[0], "system": ""}], toks["chat"], system_prompt="You are Default.")
    assert text.startswith("<|im_start|>system\nYou are Default.<|im_end|>")
    text, _, _ = text_and_targets([{**rows[0], "system": None}], toks["chat"])
    assert text.startswith("<|im_start|>user\n")  # neither: no system turn (the template may write its own)
    own = {"messages": [{"role": "system", "content": "Own."}, {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "ok"}]}
    text, _, _ = text_and_targets([own], toks["chat"], system_prompt="You are Default.")
    assert text.startswith("<|im_start|>system\nOwn.<|im_end|>") and "Default" not in text


def test_a_system_prompt_leaves_raw_prompt_completion_rows_as_they_are(toks):
    text, targets, _ = text_and_targets([{"prompt": "What is 2 + 2? ", "completion": "4"}], toks["chat"],
                                        system_prompt="You are Calc.")
    assert text == "What is 2 + 2? 4<|endoftext|>" and targets == ["4<|endoftext|>"]


def test_tools_as_lists_lose_the_fields_arrow_fills_in(toks):
    other = {"name": "add", "parameters": {"type": "object", "required": ["a"]}}
    ds = datasets.Dataset.from_list([{**TOOL_ROW, "tools": [TOOL]}, {**TOOL_ROW, "tools": [other]}])  # one struct
    assert ds[0]["tools"][0]["parameters"]["required"] is None
    text = toks["tools"].decode(ins.process(ds.select([0]), toks["tools"], block_size=512).dataset[0]["input_ids"])
    assert json.dumps(TOOL["parameters"]) in text and "null" not in text
