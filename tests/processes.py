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
from tests.helpers import model_params

BIN = Path(sys.executable).parent  # the environment's console scripts (leantrain, torchrun, accelerate)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra) -> dict:
    """This environment for a launched run: gloo on loopback, offline, one thread per process, no fault injection."""
    e = dict(os.environ, GLOO_SOCKET_IFNAME="lo", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
             OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    e.pop("LEANTRAIN_FAULT", None)
    e.update(extra)
    return e


def run(cmd: list[str], timeout: int = 300, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(**extra))


def launched(*args: str, **extra) -> subprocess.CompletedProcess:
    """``leantrain train ARGS`` (with ``--nproc``) run by this process, as the console script runs it: the launcher's
    checks here, then torchrun and its workers in their own processes (environment ``env(**extra)``), their output
    captured. The same path as ``run([BIN / "leantrain", "train", ...])`` without a fresh interpreter paying the
    imports of torch and transformers a second time for the launcher (a third of a 2-process launch's CPU time).
    Tests of the console script itself, its signals and its output ordering start it with ``run``."""
    import tempfile

    from leantrain.cli import main

    saved, streams, fds = dict(os.environ), (sys.stdout, sys.stderr), [os.dup(1), os.dup(2)]
    sys.stdout.flush(), sys.stderr.flush()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
        sys.stdout, sys.stderr = out, err
        os.environ.clear(), os.environ.update(env(**extra))
        try:
            rc = main(["train", *args])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        finally:
            out.flush(), err.flush()
            sys.stdout, sys.stderr = streams
            os.environ.clear(), os.environ.update(saved)
            os.dup2(fds[0], 1), os.dup2(fds[1], 2)
            for fd in fds:
                os.close(fd)
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(["leantrain", "train", *args], rc, out.read(), err.read())


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
    r = launched(str(path), "--nproc", "2", f"output_dir={tmp_path / 'p2'}")
    assert r.returncode == 0, r.stderr[-4000:]
    a, b = tmp_path / "single", tmp_path / "p2"
    assert_same_training(a, b)
    assert json.loads((b / "summary.json").read_text())["train"]["accumulation_steps"] == 2
    return a, b
