"""Language-model and instruction data that used to slip through (issue 27, items 12, 13, 17-20 and the eval
message): each problem names the key, file, line or row; no model is involved."""

from __future__ import annotations


import pytest

from leantrain.config import DataConfig, resolve
from leantrain.data.lm import instructions as ins
from leantrain.data.lm import rendering as rd
from leantrain.data.lm import corpus
from leantrain.data.lm import sft
from leantrain.data.sources import SourceError
from leantrain.data.lm.token_sources import open_token_source
from leantrain.errors import DataError
from tests.helpers import make_tiny_lm_tokenizer, write_jsonl

pytestmark = pytest.mark.usefixtures("own_datasets_cache")


@pytest.mark.parametrize("content, says", [
    (b'{"text": "fine"}\n{"text": "caf\xe9"}\n', "bad.jsonl line 2: not valid UTF-8"),  # item 12
    (b'{"text": "one two"}\n{"text": "three"}\n{"text": 5}\n', "line 3: column 'text' holds 5 (int), not text"),  # 20
])
def test_a_jsonl_text_problem_names_the_line(tmp_path, content, says):
    (tmp_path / "bad.jsonl").write_bytes(content)
    with pytest.raises(SourceError) as e:
        open_token_source(str(tmp_path / "bad.jsonl"), "data.train")
    assert says in str(e.value)


def test_a_broken_train_file_says_nothing_made_up_about_the_eval_file(tmp_path):
    (tmp_path / "broken.jsonl").write_text('{"text": "a"}\n{"text": \n')
    write_jsonl(tmp_path / "eval.jsonl", [{"instruction": "a", "output": "b"}])  # two text columns
    cfg = DataConfig(train=str(tmp_path / "broken.jsonl"), eval=str(tmp_path / "eval.jsonl"))
    with pytest.raises(DataError) as e:
        corpus.load_and_validate(cfg, seed=0, batch_size=2)
    assert "broken.jsonl line 2" in str(e.value.problems) and "data.text_column" not in str(e.value.problems)


def test_a_folder_of_txt_files_names_what_it_skips(tmp_path):  # item 18
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for name, text in (("a.txt", "one two three"), ("b.csv", "text\nx\n"), ("e.jsonl", '{"text": "x"}\n'),
                       ("sub/d.txt", "four")):
        (tmp_path / "d" / name).write_text(text)
    data = corpus.load_and_validate(DataConfig(train=str(tmp_path / "d")), seed=0, batch_size=2)
    assert [p.name for p in data.train.source.files] == ["a.txt"]
    assert any("skipped" in n and "b.csv, e.jsonl, sub/" in n for n in data.notes)


def test_unknown_placeholders_are_refused_and_escapes_are_read_alike():  # item 17
    with pytest.raises(DataError, match=r"unknown placeholder \{sytem\}"):
        rd.check_template("S: {sytem} Q: {prompt} A: {response}")
    cfg = resolve(None, [r"data.template=Q: {prompt}\nA: {response}", r"data.document_separator=\n\n"])
    assert cfg.data.template == "Q: {prompt}\nA: {response}" and cfg.data.document_separator == "\n\n"


def test_empty_responses_are_warned_with_their_count(tmp_path):  # item 19
    rows = [{"instruction": f"say {i}", "output": " " if i % 3 == 0 else "ok"} for i in range(9)]
    write_jsonl(tmp_path / "t.jsonl", rows)
    data = sft.load_and_validate(DataConfig(train=str(tmp_path / "t.jsonl")), seed=0, batch_size=2)
    assert any("3 of 9 examples have an empty response (lines 1, 4, 7)" in w for w in data.warnings)


@pytest.mark.parametrize("template, says", [
    ("{% for m in messages %}{{ m['content'] }", "TemplateSyntaxError"),
    ("{{ raise_exception('no system role') }}", "no system role"),
])
def test_a_failing_chat_template_names_the_template_and_the_row(tmp_path, template, says):  # item 13
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(make_tiny_lm_tokenizer(tmp_path / "tok"))
    tok.chat_template = template
    write_jsonl(tmp_path / "t.jsonl", [{"instruction": "hello", "output": "world"}] * 2)
    import datasets

    ds = datasets.load_dataset("json", data_files=str(tmp_path / "t.jsonl"), split="train")
    with pytest.raises(DataError) as e:
        ins.process(ds, tok, block_size=32, template="chat")
    assert "data.train: row 1: the chat template" in str(e.value) and says in str(e.value)
