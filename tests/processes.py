"""Helpers for tests that start leantrain in other processes (the real launchers, 2-4 CPU processes on gloo over
loopback): ``from tests.processes import run, one_and_two_processes``. Data and model helpers are in helpers.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from leantrain import train
from leantrain.report.logs import read_metrics
from tests.helpers import cli_here, model_params, process_env

BIN = Path(sys.executable).parent  # the environment's console scripts (leantrain, torchrun, accelerate)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], timeout: int = 300, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=process_env(**extra))


def train_losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r["type"] == "train"]


def assert_same_training(a: Path, b: Path, atol: float = 2e-5) -> None:
    """The two run folders end with the same parameters and logged the same per-step losses."""
    pa, pb = model_params(a), model_params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-4, atol=atol, msg=k)
    assert train_losses(a) == pytest.approx(train_losses(b), rel=1e-5)


def one_and_two_processes(tmp_path: Path, cfg: dict) -> tuple[Path, Path]:
    """``cfg`` (batch 8, micro-batch 2, 6 steps) trained in this process (1 x accumulation 4) and through the
    launcher as 2 processes (2 x accumulation 2); both run folders, their training already checked equal."""
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    single = train(path, [f"output_dir={tmp_path / 'single'}"])
    assert single["train"]["accumulation_steps"] == 4 and single["train"]["steps"] == 6
    r = cli_here("train", str(path), "--nproc", "2", f"output_dir={tmp_path / 'p2'}")
    assert r.returncode == 0, r.stderr[-4000:]
    a, b = tmp_path / "single", tmp_path / "p2"
    assert_same_training(a, b)
    assert json.loads((b / "summary.json").read_text())["train"]["accumulation_steps"] == 2
    return a, b
