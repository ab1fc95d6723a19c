"""Instruction / chat data: format detection, rendering (chat template with and without generation marks, plain
template, prompt/completion), response-only labels, multi-turn, truncation, bad shapes."""

from __future__ import annotations

import datasets
import pytest
from transformers import AutoTokenizer

from leantrain.data.lm import instructions as ins
from leantrain.data.lm import instruction_formats as formats_
from leantrain.errors import DataError
from tests.helpers import CHATML, CHATML_GENERATION, make_tiny_chat_tokenizer

ROWS = {
    "messages": {"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "What is 2 + 2?"},
                              {"role": "assistant", "content": "The answer is 4."}]},
    "sharegpt": {"conversations": [{"from": "system", "value": "Be kind."},
                                   {"from": "human", "value": "What is 2 + 2?"},
                                   {"from": "gpt", "value": "The answer is 4."}]},
    "alpaca": {"instruction": "What is 2 + 2?", "input": "", "output": "The answer is 4."},
    "dolly": {"instruction": "What is 2 + 2?", "context": "numbers", "response": "The answer is 4.", "category": "qa"},
    "prompt_completion": {"prompt": "What is 2 + 2? ", "completion": "The answer is 4."},
}
MULTI = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "The answer is 4."},
         {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hello world."}]


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    root = tmp_path_factory.mktemp("toks")
    return {name: AutoTokenizer.from_pretrained(make_tiny_chat_tokenizer(root / name, chat_template=tpl))
            for name, tpl in (("plain", None), ("chat", CHATML), ("generation", CHATML_GENERATION))}


def trained_text(row, tok) -> list[str]:
    """The decoded runs of target tokens."""
    return [p.split("]]")[0] for p in ins.show_example(row, tok).split("[[")[1:]]


def one(rows, tok, **kw):
    return ins.process(datasets.Dataset.from_list(rows), tok, block_size=kw.pop("block_size", 256), **kw)


@pytest.mark.parametrize("fmt", list(ROWS))
def test_every_format_is_detected_and_trains_only_the_response(fmt, toks):
    tok = toks["plain"]
    data = one([ROWS[fmt]] * 2, tok)
    assert data.format == fmt and len(data.dataset) == 2
    row = data.dataset[0]
    assert trained_text(row, tok) == ["The answer is 4.<|endoftext|>"]  # the EOS after the response is a target
    assert row["length"] == len(row["input_ids"]) == len(row["labels"])
    assert row["targets"] == sum(y != -100 for y in row["labels"][1:])
    assert "format" in data.notes[0]


def test_plain_template_fields_and_system(toks):
    tok = toks["plain"]
    row = one([ROWS["messages"]], tok).dataset[0]
    assert tok.decode(row["input_ids"]) == ("Be kind.\n\n### Instruction:\nWhat is 2 + 2?\n\n### Response:\n"
                                            "The answer is 4.<|endoftext|>")
    custom = one([ROWS["alpaca"]], tok, template="{system}Q: {prompt}\nA: {response}").dataset[0]
    assert tok.decode(custom["input_ids"]) == "Q: What is 2 + 2?\nA: The answer is 4.<|endoftext|>"
    assert trained_text(custom, tok) == ["The answer is 4.<|endoftext|>"]


def test_alpaca_input_joins_the_instruction(toks):
    row = dict(ROWS["alpaca"], input="Use digits.")
    out = one([row], toks["plain"]).dataset[0]
    assert "What is 2 + 2?\n\nUse digits." in toks["plain"].decode(out["input_ids"])


@pytest.mark.parametrize("bad", ["Q: {prompt}", "{response} then {prompt}", "{prompt}{prompt}{response}"])
def test_bad_custom_template_is_refused(bad, toks):
    with pytest.raises(DataError, match="data.template"):
        one([ROWS["alpaca"]], toks["plain"], template=bad)


def test_chat_template_used_when_the_tokenizer_has_one(toks):
    for name in ("chat", "generation"):
        data = one([ROWS["messages"]], toks[name])
        assert data.rendering.mode == name and data.rendering.chat
        text = toks[name].decode(data.dataset[0]["input_ids"])
        assert text.startswith("<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\n")
        assert trained_text(data.dataset[0], toks[name]) == ["The answer is 4.<|im_end|>\n"]
    plain = one([ROWS["messages"]], toks["chat"], template="plain")
    assert plain.rendering.mode == "plain" and not plain.rendering.chat
    with pytest.raises(DataError, match="no chat template"):
        one([ROWS["messages"]], toks["plain"], template="chat")


def test_prompt_completion_is_joined_as_is_unless_a_template_is_named(toks):
    data = one([ROWS["prompt_completion"]], toks["chat"])
    assert data.rendering.mode == "raw"
    assert toks["chat"].decode(data.dataset[0]["input_ids"]) == "What is 2 + 2? The answer is 4.<|endoftext|>"
    assert one([ROWS["prompt_completion"]], toks["chat"], template="chat").rendering.mode == "chat"


def test_generation_marks_and_prefix_diff_agree_on_multi_turn(toks):
    rows = [{"messages": MULTI}]
    marked, diffed = one(rows, toks["generation"]).dataset[0], one(rows, toks["chat"]).dataset[0]
    assert marked["input_ids"] == diffed["input_ids"] and marked["labels"] == diffed["labels"]
    assert trained_text(marked, toks["chat"]) == ["The answer is 4.<|im_end|>\n", "Hello world.<|im_end|>\n"]
    plain = one(rows, toks["plain"]).dataset[0]
    assert trained_text(plain, toks["plain"]) == ["The answer is 4.<|endoftext|>", "Hello world.<|endoftext|>"]


def test_train_on_prompt_labels_every_token_but_the_first(toks):
    row = one([{"messages": MULTI}], toks["chat"], train_on_prompt=True).dataset[0]
    assert row["labels"][0] == -100 and row["labels"][1:] == row["input_ids"][1:]
    assert row["targets"] == row["length"] - 1
    masked = one([{"messages": MULTI}], toks["chat"]).dataset[0]
    assert masked["targets"] < row["targets"]


def test_long_rows_are_cut_from_the_end_and_dropped_without_a_target(toks):
    tok = toks["plain"]
    full = one([ROWS["alpaca"]], tok).dataset[0]
    prompt_len = full["labels"].index(next(y for y in full["labels"] if y != -100))
    rows = [ROWS["alpaca"], dict(ROWS["alpaca"], instruction="What is 2 + 2? " * 20)]
    data = one(rows, tok, block_size=prompt_len + 2)
    assert (data.truncated, data.dropped, len(data.dataset)) == (2, 1, 1)
    assert data.dataset[0]["length"] == prompt_len + 2 and data.dataset[0]["targets"] == 2
    assert "cut from the end" in data.notes[-1] and "1 left with no response token were dropped" in data.notes[-1]


def test_unknown_shape_names_file_columns_and_formats(toks):
    with pytest.raises(DataError) as e:
        one([{"question": "a", "answer": "b"}], toks["plain"], where="data.train: qa.jsonl")
    text = str(e.value)
    assert "data.train: qa.jsonl" in text and "question, answer" in text
    assert all(desc in text for _, _, desc in formats_.FORMATS.values())
    assert e.value.exit_code == 2


@pytest.mark.parametrize("rows, match", [
    ([{"messages": [{"role": "user", "content": "hi"}]}], "row 1: no assistant turn"),
    ([ROWS["messages"], {"messages": [{"role": "robot", "content": "hi"}]}], "row 2: turn 1: role 'robot'"),
    ([{"conversations": [{"from": "alien", "value": "hi"}]}], "from 'alien' is none of"),
    ([{"messages": [{"role": "user"}]}], "turn 1 has no 'role' / 'content'"),
    ([{"instruction": "", "output": "x"}], "'instruction' is blank"),
    ([{"prompt": "a", "completion": None}], "'completion' is missing"),
])
def test_bad_rows_are_named(rows, match, toks):
    with pytest.raises(DataError, match=match):
        one(rows, toks["plain"])


def test_show_example_marks_the_trained_spans(toks):
    row = one([ROWS["alpaca"]], toks["plain"]).dataset[0]
    shown = ins.show_example(row, toks["plain"])
    assert shown.endswith("### Response:\n[[The answer is 4.<|endoftext|>]]")


def test_a_default_system_prompt_is_not_learnt_when_the_assistant_speaks_first(toks, tmp_path):
    tok = AutoTokenizer.from_pretrained(make_tiny_chat_tokenizer(
        tmp_path / "t", chat_template="{{ '<|im_start|>system\nBe kind.<|im_end|>\n' }}" + CHATML))
    row = one([{"messages": [{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": "Hello world."}]}], tok).dataset[0]
    assert trained_text(row, tok) == ["Hello<|im_end|>\n", "Hello world.<|im_end|>\n"]
