"""Kill-and-resume with 2 processes (gloo): both ranks SIGKILLed after a step, resumed with --nproc 2, must give
bitwise the same per-step trajectory and final parameters as an uninterrupted 2-process run."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import make_tiny_bert, model_params, resume_data, run_train_process, trajectory

pytestmark = pytest.mark.distributed
TWO = ("--nproc", "2", "train.micro_batch_size=2", "efficiency.precision=fp32")  # 8 = 2 micro x 2 accumulation x 2


def test_two_process_kill_and_resume_is_bitwise(tmp_path):
    make_tiny_bert(tmp_path / "bert", dropout=0.1, layers=1, hidden=16)
    ref, chain = resume_data(tmp_path, "ref"), resume_data(tmp_path, "chain")
    env = {"GLOO_SOCKET_IFNAME": "lo"}
    done = run_train_process(ref, *TWO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    killed = run_train_process(chain, *TWO, env={**env, "LEANTRAIN_TEST_KILL_AT_STEP": "3"})
    assert killed.returncode != 0 and not (chain / "run" / "summary.json").exists()
    resumed = run_train_process(chain, *TWO, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert trajectory(chain / "run") == trajectory(ref / "run")
    a, b = model_params(ref / "run"), model_params(chain / "run")
    assert all(torch.equal(a[k], b[k]) for k in a)
    summary = json.loads((chain / "run" / "summary.json").read_text())
    assert summary["train"]["resumed_from_step"] == 2 and summary["distributed"]["world_size"] == 2
