"""Instruction tuning end to end: masked prompts keep the global normalisation, 1 process x accumulation 4 == 2
processes x accumulation 2 (the real launcher, gloo), packed (the default) and not; sample prompts run through the
chat template before training and at each evaluation; a file that is neither text nor instruction data exits 2."""

from __future__ import annotations

import json
import random

import pytest

from leantrain.report.logs import read_metrics
from tests.helpers import CHATML, cli_here, make_tiny_chat_tokenizer, make_tiny_llama
from tests.processes import one_and_two_processes

WORDS = "what is two and four hello world once upon a time there was small model numbers colours animals".split()


def rows(n: int, seed: int) -> list[dict]:
    """Alpaca rows with prompts and answers of uneven lengths (different target counts per row)."""
    r = random.Random(seed)
    say = lambda lo, hi: " ".join(r.choice(WORDS) for _ in range(r.randint(lo, hi)))  # noqa: E731
    return [{"instruction": say(1, 25), "input": say(0, 8) if r.random() < 0.3 else "", "output": say(1, 12)}
            for _ in range(n)]


def jsonl(path, data):
    path.write_text("".join(json.dumps(x) + "\n" for x in data))
    return str(path)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft-model")
    return make_tiny_llama(root / "model", make_tiny_chat_tokenizer(root / "tok", chat_template=CHATML))


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("packing", [True, False])
def test_sft_two_processes_accumulation_two_equals_one_process(tmp_path, model, packing):
    cfg = {
        "model": {"name": str(model)},
        "data": {"train": jsonl(tmp_path / "train.jsonl", rows(40, 0)),
                 "eval": jsonl(tmp_path / "eval.jsonl", rows(7, 1)), "block_size": 64, "packing": packing},
        "train": {"batch_size": 8, "micro_batch_size": 2, "max_steps": 6, "lr": 1e-3, "log_every_steps": 1, "seed": 7},
        "report": {"plots": False, "progress": "plain", "sample_prompts": ["what is two and two"],
                   "sample_max_new_tokens": 4},
        "efficiency": {"precision": "fp32"},
    }
    a, b = one_and_two_processes(tmp_path, cfg)
    ea, eb = (json.loads((d / "summary.json").read_text())["eval"] for d in (a, b))
    assert ea["tokens"] == eb["tokens"] and ea["loss"] == pytest.approx(eb["loss"], rel=1e-5)
    samples = [r for r in read_metrics(a / "metrics.jsonl") if r["type"] == "samples"]
    assert samples[0]["step"] == 0 and samples[-1]["step"] == 6  # before training, and at the evaluation
    assert samples[0]["samples"][0]["prompt"] == "what is two and two"


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

    held = jsonl(tmp_path / "held.jsonl", rows(5, 2))
    summary = train(None, [f"model.name={model}", f"data.train={jsonl(tmp_path / 'train.jsonl', rows(16, 3))}",
                           f"data.eval={held}", "data.block_size=48", "data.train_on_prompt=true",
                           "train.max_steps=2", "train.batch_size=8", "efficiency.precision=fp32",
                           "report.plots=false", f"output_dir={tmp_path / 'run'}"])
    out = tmp_path / "eval.json"
    assert main(["eval", str(tmp_path / "run" / "model"), f"data.eval={held}", "--output", str(out)]) == 0
    got = json.loads(out.read_text())["eval"]
    assert got["tokens"] == summary["eval"]["tokens"]
    assert got["loss"] == pytest.approx(summary["eval"]["loss"], rel=1e-5)
