"""The SFT data side inside the causal-LM ``tokens`` side: instruction/chat files are recognised by their columns,
checked with file lines, rendered and packed; plain text goes to the token blocks; neither is exit 2 naming the file,
its columns and the formats; sample prompts are wrapped as the model was trained."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from leantrain.config import resolve
from leantrain.data.lm import instruction_formats as formats_
from leantrain.data.lm import sft
from leantrain.data.modalities import for_modality
from leantrain.errors import DataError
from tests.helpers import CHATML, make_tiny_chat_tokenizer

pytestmark = pytest.mark.usefixtures("own_datasets_cache")
QA = [("What is 2 + 2?", "The answer is 4."), ("Hello", "Hello world."), ("Once upon a time", "there was a model.")]


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def alpaca(n):
    return [{"instruction": QA[i % 3][0], "input": "", "output": QA[i % 3][1]} for i in range(n)]


def cfg(**data):
    return resolve(overrides=[f"data.{k}={v}" for k, v in data.items()]).data


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(make_tiny_chat_tokenizer(tmp_path_factory.mktemp("tok"), chat_template=CHATML))


def test_instruction_file_goes_through_the_sft_side(tmp_path, tok):
    side = for_modality("tokens")
    data_cfg = cfg(train=jsonl(tmp_path / "train.jsonl", alpaca(30)), block_size=64)
    prepared = side.load_and_validate(data_cfg, seed=0, batch_size=4)
    assert prepared.columns == {"format": "alpaca"} and len(prepared.train) == 27 and len(prepared.eval) == 3
    assert any("format instruction / input / output" in n for n in prepared.notes)
    rows = side.process(prepared.train, tok, data_cfg, desc="Processing train")
    assert {"input_ids", "labels", "position_ids", "length", "targets"} <= set(rows.column_names)  # packed: auto
    assert sum(rows["targets"]) > 0 and len(rows) < 27
    unpacked = side.process(prepared.train, tok, cfg(train=data_cfg.train, block_size=64, packing="false"))
    assert len(unpacked) == 27 and "position_ids" not in unpacked.column_names
    batch = side.collator(tok, data_cfg, train=True)([dict(r) for r in rows.select(range(2))])
    assert "position_ids" in batch and batch["labels"].shape == batch["input_ids"].shape


def test_plain_text_still_goes_to_the_token_blocks(tmp_path):
    (tmp_path / "corpus.txt").write_text("Once upon a time there was a small model.\n" * 50)
    prepared = for_modality("tokens").load_and_validate(cfg(train=str(tmp_path / "corpus.txt")), seed=0, batch_size=4)
    assert "format" not in prepared.columns


def test_a_text_column_set_means_language_modelling_of_it(tmp_path):
    path = jsonl(tmp_path / "train.jsonl", alpaca(30))
    prepared = for_modality("tokens").load_and_validate(cfg(train=path, text_column="output"), seed=0, batch_size=4)
    assert prepared.columns == {"text": "output"}


def test_neither_text_nor_instructions_names_file_columns_and_formats(tmp_path):
    path = jsonl(tmp_path / "qa.jsonl", [{"question": "a", "answer": "b"}])
    with pytest.raises(DataError) as e:
        for_modality("tokens").load_and_validate(cfg(train=path), seed=0, batch_size=4)
    text = str(e.value)
    assert "qa.jsonl" in text and "question, answer" in text and e.value.exit_code == 2
    assert all(desc in text for *_, desc in formats_.FORMATS.values())


def test_bad_rows_are_named_by_file_line(tmp_path):
    rows = alpaca(4)
    rows[2]["output"] = None
    path = tmp_path / "train.jsonl"
    path.write_text("\n" + "".join(json.dumps(r) + "\n" for r in rows))  # a blank first line: rows are lines 2-5
    with pytest.raises(DataError, match=r"train.jsonl: line 4: 'output' is missing"):
        for_modality("tokens").load_and_validate(cfg(train=str(path)), seed=0, batch_size=4)
    evaluation = jsonl(tmp_path / "eval.jsonl", [{"text": "plain"}])
    with pytest.raises(DataError, match=r"eval.jsonl: not instruction/chat data; columns found: text"):
        for_modality("tokens").load_and_validate(cfg(train=jsonl(tmp_path / "t.jsonl", alpaca(4)), eval=evaluation),
                                                 seed=0, batch_size=4)


def test_sample_prompts_are_wrapped_as_trained(tok, tmp_path):
    columns = {"format": "alpaca"}
    assert sft.sample_inputs(["Hi"], tok, cfg(), columns) == sft.Prompts(["Hi"], True)  # generation applies the chat
    assert sft.sample_inputs(["Hi"], tok, cfg(template="plain"), columns) == sft.Prompts(
        ["### Instruction:\nHi\n\n### Response:\n"], False)
    assert sft.sample_inputs(["Hi"], tok, cfg(), {"format": "prompt_completion"}) == sft.Prompts(["Hi"], False)
    assert sft.sample_inputs(["Hi"], tok, cfg(), {"text": "text"}) == sft.Prompts(["Hi"], None)  # generation's default
    assert sft.sample_inputs(["Hi"], tok, cfg(system_prompt="Be brief."), columns) == sft.Prompts(["Hi"], True,
                                                                                                  "Be brief.")
    assert sft.sample_inputs(["Hi"], tok, cfg(template="plain", system_prompt="Be brief."), columns) == sft.Prompts(
        ["Be brief.\n\n### Instruction:\nHi\n\n### Response:\n"], False)


TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]
READS_TOOLS = "{% if tools %}{{ '<|im_start|>tools\n' + (tools | tojson) + '<|im_end|>\n' }}{% endif %}" + CHATML


@pytest.mark.parametrize("template, chat_template", [("auto", CHATML), ("auto", READS_TOOLS), ("plain", CHATML),
                                                     ("Sys {system} | Q {prompt} | A {response}", CHATML)])
def test_generation_prompt_is_the_trained_prompt_with_system_and_tools(tmp_path, template, chat_template):
    """The ids generation sends for a prompt are the ids training put before the response of a row with that
    instruction, the same data.system_prompt and the same tools: the system prompt and the tool schemas included."""
    from leantrain.data.lm import rendering as rd
    from leantrain.data.lm.conversation import row_tools
    from leantrain.modeling.generation.prompts import prompt_lengths, prompt_texts

    tok = AutoTokenizer.from_pretrained(make_tiny_chat_tokenizer(tmp_path / "tok", chat_template=chat_template))
    data_cfg = cfg(system_prompt="Answer briefly.", template=template)
    row = {"instruction": "What is 2 + 2?", "input": "", "output": "The answer is 4.", "tools": TOOLS}
    rendering = rd.choose_rendering(tok, data_cfg.template, "alpaca")
    ids, mask = rd.render(formats_.to_messages(row, "alpaca", data_cfg.system_prompt), tok, rendering, row_tools(row))
    trained_prompt = ids[:mask.index(True)]
    rendered = sft.sample_inputs([row["instruction"]], tok, data_cfg, {"format": "alpaca"}, TOOLS)
    texts, templated = prompt_texts(tok, rendered.texts, **rendered.context())
    sent = tok(texts, add_special_tokens=not templated)["input_ids"][0]
    assert sent == trained_prompt and prompt_lengths(tok, texts, templated) == [len(trained_prompt)]
    text = tok.decode(sent)
    assert "Answer briefly." in text and '"add"' in text and "What is 2 + 2?" in text
    assert (rendered.tools is not None) == (chat_template == READS_TOOLS and rendering.chat)  # else in the system text


def test_data_error_counts_the_bad_rows_not_the_printed_lines(tmp_path):
    rows = alpaca(200)
    for r in rows[:153]:
        r["output"] = 7
    with pytest.raises(DataError) as e:
        for_modality("tokens").load_and_validate(cfg(train=jsonl(tmp_path / "t.jsonl", rows)), seed=0, batch_size=4)
    assert str(e.value).startswith("the data has 153 problems:")
    assert "148 more rows with problems" in str(e.value) and "formats accepted" in str(e.value)


def test_placeholders_are_warned_with_their_count(tmp_path):
    rows = alpaca(10)
    for r in rows[:4]:
        r["output"] = "I am {{name}}, made by {{author}}."
    rows[4]["instruction"] = "Who is {{ name }}?"
    data = for_modality("tokens").load_and_validate(cfg(train=jsonl(tmp_path / "t.jsonl", rows)), seed=0,
                                                    batch_size=4)
    [warning] = [w for w in data.warnings if "placeholders" in w]
    assert "5 of 10 rows hold template placeholders ({{name}} (4x), {{author}} (4x), {{ name }} (1x))" in warning
    assert "trained literally" in warning
    clean = for_modality("tokens").load_and_validate(cfg(train=jsonl(tmp_path / "c.jsonl", alpaca(10))), seed=0,
                                                     batch_size=4)
    assert not [w for w in clean.warnings if "placeholders" in w]
