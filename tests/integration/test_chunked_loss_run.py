"""The chunked loss in real runs (tiny Llama from a config, a small word-level tokenizer, fp32): a run with
efficiency.chunked_loss=true trains and evaluates like the plain one (same per-step losses, parameters and eval
loss), says so in its log, and does the same under DDP and FSDP (2 processes, gloo: both runs in one torchrun
launch, ``tests.processes.two_processes_each``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from leantrain import train
from tests.helpers import TINY_LLAMA, lm_documents, make_tiny_lm_tokenizer
from tests.processes import assert_same_training, two_processes_each


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("chunked")
    tok = make_tiny_lm_tokenizer(root / "tok")
    (root / "train.txt").write_text("\n\n".join(lm_documents(60, 0)))
    (root / "valid.txt").write_text("\n\n".join(lm_documents(20, 1)))
    over = [*TINY_LLAMA, f"model.tokenizer={tok}", "model.task=causal-lm", f"data.train={root / 'train.txt'}",
            f"data.eval={root / 'valid.txt'}", "data.block_size=16", "data.document_separator=\\n\\n",
            "data.document_mask=true", "data.max_train_samples=42", "data.max_eval_samples=13",
            "train.batch_size=8", "train.micro_batch_size=2", "train.max_steps=6", "train.lr=3e-3",
            "train.log_every_steps=1", "train.seed=7", "train.eval_every_steps=3", "report.plots=false",
            "report.progress=plain", "efficiency.precision=fp32"]
    logs = {}
    for name in ("plain", "chunked"):
        seen = Lines()
        logging.getLogger("leantrain").addHandler(seen)
        try:
            logs[name] = train(None, [*over, f"efficiency.chunked_loss={str(name == 'chunked').lower()}",
                                      f"output_dir={root / name}"])
        finally:
            logging.getLogger("leantrain").removeHandler(seen)
        (root / f"{name}.messages").write_text("\n".join(seen.lines))
    return root, over, logs["plain"], logs["chunked"]


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def log_text(folder: Path) -> str:
    return folder.with_suffix(".messages").read_text()


def test_chunked_run_equals_the_plain_run(job):
    root, _, plain, chunked = job
    assert_same_training(root / "plain", root / "chunked")
    assert chunked["eval"]["loss"] == pytest.approx(plain["eval"]["loss"], rel=1e-5)
    assert chunked["eval"]["tokens"] == plain["eval"]["tokens"]
    assert "chunked loss: on (as configured" in log_text(root / "chunked")
    assert "chunked loss: off (efficiency.chunked_loss=false)" in log_text(root / "plain")



def test_leantrain_eval_of_a_causal_lm_with_the_chunked_loss(job):
    from leantrain.commands.eval import evaluate_as_training
    from leantrain.methods import get_task
    from leantrain.config import resolve

    root, _, plain, _ = job
    cfg = resolve(None, [f"data.eval={root / 'valid.txt'}", "data.max_eval_samples=13", "efficiency.chunked_loss=true"])
    seen = Lines()
    logging.getLogger("leantrain").addHandler(seen)
    try:
        result = evaluate_as_training(str(root / "plain" / "model"), get_task("causal-lm"), cfg, None, batch_size=4)
    finally:
        logging.getLogger("leantrain").removeHandler(seen)
    assert any(line.startswith("chunked loss: on") for line in seen.lines)
    assert result["eval"]["loss"] == pytest.approx(plain["eval"]["loss"], rel=1e-5)


@pytest.fixture(scope="module")
def two(job) -> Path:
    """The chunked run under DDP and under FSDP, 2 processes each, in <root>/two/<strategy>/p2 (one launch)."""
    root, over, _, _ = job
    (root / "two").mkdir()
    two_processes_each(root / "two", {s: {"efficiency": {"chunked_loss": True}, "distributed": {"strategy": s}}
                                      for s in ("ddp", "fsdp")}, *over)
    return root / "two"


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_chunked_loss_under_ddp_and_fsdp(job, two, strategy):
    root = job[0]
    out = two / strategy / "p2"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["distributed"]["strategy"] == strategy and summary["efficiency"]["chunked_loss"] is True
    assert_same_training(root / "plain", out)
