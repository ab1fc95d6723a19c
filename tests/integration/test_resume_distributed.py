"""Stopped and resumed with 2 processes (gloo): both ranks SIGKILLed after a step, and SIGTERM to rank 1 alone (the
ranks must agree on the step), each followed by a resume with --nproc 2, must give bitwise the same per-step
trajectory and final parameters as an uninterrupted 2-process run. One chain holds both stops: each launch pays the
imports of two workers, and a resume that is stopped again is resumed as exactly as a fresh one."""

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


def test_two_processes_killed_then_sigterm_on_one_rank_resume_bitwise(reference):
    """One chain of three launches: both ranks SIGKILLed after step 3 (resumed from the step-2 checkpoint), that
    resumed run stopped by SIGTERM to rank 1 alone after step 5 (the ranks agree and save step 5), resumed again to
    the end: bitwise the uninterrupted run."""
    chain = resume_data(reference, "chain")
    killed = cli_here("train", *resume_args(chain, *TWO), LEANTRAIN_TEST_KILL_AT_STEP="3")
    assert killed.returncode != 0 and not (chain / "run" / "summary.json").exists()
    stopped = cli_here("train", *resume_args(chain, *TWO), LEANTRAIN_TEST_SIGNAL_AT_STEP="TERM@5:1")  # rank 1 alone
    assert "resuming from" in stopped.stderr and "step-0000002" in stopped.stderr, stopped.stderr[-3000:]
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert "stopped by SIGTERM after step 5" in stopped.stderr
    assert "step-0000005" in sorted(p.name for p in (chain / "run" / "checkpoints").iterdir())
    assert not (chain / "run" / "summary.json").exists()
    resumed = cli_here("train", *resume_args(chain, *TWO))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _same_as_reference(reference, chain)
    summary = json.loads((chain / "run" / "summary.json").read_text())
    assert summary["train"]["resumed_from_step"] == 5 and summary["distributed"]["world_size"] == 2
