"""Stopped and resumed with 2 processes (gloo): both ranks SIGKILLed after a step, and SIGTERM to rank 1 alone (the
ranks must agree on the step), each followed by a resume with --nproc 2, must give bitwise the same per-step
trajectory and final parameters as an uninterrupted 2-process run. One chain holds both stops: each launch pays the
imports of two workers, and a resume that is stopped again is resumed as exactly as a fresh one. The uninterrupted
run and the chain's last resume share one launch (``tests.processes.train_each``); the launcher ``leantrain --nproc``
starts the stopped launches, the second of them a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import cli_here, make_tiny_bert, model_params, resume_args, resume_data, trajectory
from tests.processes import train_each

pytestmark = pytest.mark.distributed
KEYS = ("train.micro_batch_size=2", "efficiency.precision=fp32")  # 8 = 2 micro x 2 accumulation x 2
TWO = ("--nproc", "2", *KEYS)


def _same_as_reference(root: Path, chain: Path) -> None:
    ref = root / "ref"
    assert trajectory(chain / "run") == trajectory(ref / "run")
    a, b = model_params(ref / "run"), model_params(chain / "run")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_two_processes_killed_then_sigterm_on_one_rank_resume_bitwise(tmp_path):
    """One chain of three launches: both ranks SIGKILLed after step 3 (resumed from the step-2 checkpoint), that
    resumed run stopped by SIGTERM to rank 1 alone after step 5 (the ranks agree and save step 5), resumed again to
    the end (in the launch of the uninterrupted run): bitwise the uninterrupted run."""
    make_tiny_bert(tmp_path / "bert", dropout=0.1, layers=1, hidden=16)
    ref, chain = resume_data(tmp_path, "ref"), resume_data(tmp_path, "chain")
    killed = cli_here("train", *resume_args(chain, *TWO), LEANTRAIN_TEST_KILL_AT_STEP="3")
    assert killed.returncode != 0 and not (chain / "run" / "summary.json").exists()
    stopped = cli_here("train", *resume_args(chain, *TWO), LEANTRAIN_TEST_SIGNAL_AT_STEP="TERM@5:1")  # rank 1 alone
    assert "resuming from" in stopped.stderr and "step-0000002" in stopped.stderr, stopped.stderr[-3000:]
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert "stopped by SIGTERM after step 5" in stopped.stderr
    assert "step-0000005" in sorted(p.name for p in (chain / "run" / "checkpoints").iterdir())
    assert not (chain / "run" / "summary.json").exists()
    train_each(tmp_path, [(None, resume_args(ref, *KEYS)), (None, resume_args(chain, *KEYS))])
    assert (ref / "run" / "summary.json").is_file() and (chain / "run" / "summary.json").is_file()
    _same_as_reference(tmp_path, chain)
    summary = json.loads((chain / "run" / "summary.json").read_text())
    assert summary["train"]["resumed_from_step"] == 5 and summary["distributed"]["world_size"] == 2
