"""Stopped and resumed with 2 processes (gloo): both ranks SIGKILLed after a step, or SIGTERM to rank 1 alone (the
ranks must agree on the step), then resumed with --nproc 2, must give bitwise the same per-step trajectory and final
parameters as an uninterrupted 2-process run (one reference run, shared by the tests here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import cli_here, make_tiny_bert, model_params, resume_args, resume_data, trajectory

pytestmark = pytest.mark.distributed
TWO = ("--nproc", "2", "train.micro_batch_size=2", "efficiency.precision=fp32")  # 8 = 2 micro x 2 accumulation x 2


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The tiny BERT in <root>/bert and an uninterrupted 2-process run in <root>/ref; returns <root>."""
    root = tmp_path_factory.mktemp("resume-2p")
    make_tiny_bert(root / "bert", dropout=0.1, layers=1, hidden=16)
    done = cli_here("train", *resume_args(resume_data(root, "ref"), *TWO))
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def _same_as_reference(root: Path, chain: Path) -> None:
    ref = root / "ref"
    assert trajectory(chain / "run") == trajectory(ref / "run")
    a, b = model_params(ref / "run"), model_params(chain / "run")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_two_process_kill_and_resume_is_bitwise(reference):
    chain = resume_data(reference, "chain")
    killed = cli_here("train", *resume_args(chain, *TWO), LEANTRAIN_TEST_KILL_AT_STEP="3")
    assert killed.returncode != 0 and not (chain / "run" / "summary.json").exists()
    resumed = cli_here("train", *resume_args(chain, *TWO))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _same_as_reference(reference, chain)
    summary = json.loads((chain / "run" / "summary.json").read_text())
    assert summary["train"]["resumed_from_step"] == 2 and summary["distributed"]["world_size"] == 2


def test_sigterm_on_one_rank_two_processes_agree_and_resume_bitwise(reference):
    chain = resume_data(reference, "sigterm")
    stopped = cli_here("train", *resume_args(chain, *TWO), LEANTRAIN_TEST_SIGNAL_AT_STEP="TERM@3:1")  # rank 1 alone
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert "stopped by SIGTERM after step 3" in stopped.stderr
    assert "step-0000003" in sorted(p.name for p in (chain / "run" / "checkpoints").iterdir())
    assert not (chain / "run" / "summary.json").exists()
    resumed = cli_here("train", *resume_args(chain, *TWO))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _same_as_reference(reference, chain)
    assert json.loads((chain / "run" / "summary.json").read_text())["train"]["resumed_from_step"] == 3
