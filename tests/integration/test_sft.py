"""Instruction tuning end to end: a file that is neither text nor instruction data exits 2; `leantrain eval` of the
saved model gives training's eval loss. 1 process x accumulation 4 == 2 processes x accumulation 2 with masked
prompts, packed and not, with sample prompts through the chat template, is in test_tasks_distributed.py."""

from __future__ import annotations

import json

import pytest

from tests.helpers import CHATML, alpaca_rows, cli_here, make_tiny_chat_tokenizer, make_tiny_llama


def jsonl(path, data):
    path.write_text("".join(json.dumps(x) + "\n" for x in data))
    return str(path)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft-model")
    return make_tiny_llama(root / "model", make_tiny_chat_tokenizer(root / "tok", chat_template=CHATML))


def test_neither_text_nor_instructions_exits_2_before_the_model(tmp_path, model):
    path = jsonl(tmp_path / "qa.jsonl", [{"question": "a", "answer": "b"}] * 3)
    r = cli_here("train", f"model.name={model}", f"data.train={path}", f"output_dir={tmp_path / 'out'}")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "qa.jsonl" in r.stderr and "question, answer" in r.stderr and "instruction / input / output" in r.stderr


def test_eval_of_the_saved_model_matches_training(tmp_path, model):
    """`leantrain eval` on the saved folder: the run's block size, template and train_on_prompt come from
    model/leantrain.json, so eval.loss (mean over the same target tokens) is training's."""
    from leantrain import train
    from leantrain.cli import main

    held = jsonl(tmp_path / "held.jsonl", alpaca_rows(5, 2))
    train_file = jsonl(tmp_path / "train.jsonl", alpaca_rows(16, 3))
    summary = train(None, [f"model.name={model}", f"data.train={train_file}",
                           f"data.eval={held}", "data.block_size=48", "data.train_on_prompt=true",
                           "train.max_steps=2", "train.batch_size=8", "efficiency.precision=fp32",
                           "report.plots=false", f"output_dir={tmp_path / 'run'}"])
    out = tmp_path / "eval.json"
    assert main(["eval", str(tmp_path / "run" / "model"), f"data.eval={held}", "--output", str(out)]) == 0
    got = json.loads(out.read_text())["eval"]
    assert got["tokens"] == summary["eval"]["tokens"]
    assert got["loss"] == pytest.approx(summary["eval"]["loss"], rel=1e-5)
