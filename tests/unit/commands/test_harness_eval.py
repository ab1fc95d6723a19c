"""``leantrain eval --harness DIR --tasks ...``: lm-evaluation-harness on a tiny random Llama with the local task of
tests/harness_tasks (multiple choice over a JSON lines file, offline). The score is the harness's own: the same
number ``lm_eval.simple_evaluate`` gives on the same folder; an unknown task and one the harness cannot load offline
exit 2 naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leantrain.cli import main
from tests.helpers import TINY_LLAMA, lm_documents, make_tiny_chat_tokenizer, make_tiny_llama

pytest.importorskip("lm_eval")
TASKS = Path(__file__).resolve().parents[2] / "harness_tasks"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    return make_tiny_llama(root / "model", make_tiny_chat_tokenizer(root / "tok"))


def test_score_is_simple_evaluates(tiny, tmp_path, monkeypatch, capsys):
    import lm_eval
    import torch
    from lm_eval.tasks import TaskManager

    out = tmp_path / "m.json"
    assert main(["eval", str(tiny), "--harness", str(TASKS), "--tasks", "arith", "--output", str(out)]) == 0
    assert "|arith|" in capsys.readouterr().out  # the harness's table
    mine = json.loads(out.read_text())["harness"]["arith"]
    monkeypatch.chdir(TASKS)  # the task's data file is relative to its folder
    theirs = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(tiny)}, tasks=["arith"],
                                     device="cuda" if torch.cuda.is_available() else "cpu", task_manager=TaskManager(include_path=str(TASKS), include_defaults=False))
    assert mine["acc"] == theirs["results"]["arith"]["acc,none"]
    assert mine["acc_stderr"] == theirs["results"]["arith"]["acc_stderr,none"]


def test_a_task_the_harness_cannot_load_offline_exits_2(tiny, capsys):
    assert main(["eval", str(tiny), "--harness", str(TASKS), "--tasks", "arith,from_the_hub"]) == 2
    err = capsys.readouterr().err
    assert "harness task from_the_hub: the harness cannot load it" in err and "Hub" in err


def test_an_unknown_task_exits_2_naming_the_defined_ones(tiny, capsys):
    assert main(["eval", str(tiny), "--harness", str(TASKS), "--tasks", "arithmetic"]) == 2
    assert "harness task arithmetic: not defined in" in capsys.readouterr().err


def train_args(root: Path, out: Path, *extra: str) -> list[str]:
    (root / "train.txt").write_text("\n\n".join(lm_documents(16, 0)))
    return ["train", *TINY_LLAMA, f"model.tokenizer={root / 'tok'}", "model.task=causal-lm",
            f"data.train={root / 'train.txt'}", "data.block_size=16", "train.batch_size=4", "train.max_steps=2",
            "report.progress=none", "report.plots=false", f"eval.harness_dir={TASKS}", f"output_dir={out}", *extra]


@pytest.mark.usefixtures("own_datasets_cache")
def test_train_with_harness_tasks_scores_the_saved_model(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(train_args(tiny.parent, out, "eval.harness_tasks=[arith]")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert main(["eval", str(out), "--harness", str(TASKS), "--tasks", "arith", "--output", str(tmp_path / "m.json")]) == 0
    assert summary["harness"]["arith"]["acc"] == json.loads((tmp_path / "m.json").read_text())["harness"]["arith"]["acc"]
    card = (out / "model" / "README.md").read_text()
    assert "## Evaluation harness" in card and "arith acc" in card


@pytest.mark.usefixtures("own_datasets_cache")
def test_train_checks_the_harness_tasks_before_training(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(train_args(tiny.parent, out, "eval.harness_tasks=[from_the_hub]")) == 2
    assert "harness task from_the_hub" in capsys.readouterr().err and not (out / "model").exists()
