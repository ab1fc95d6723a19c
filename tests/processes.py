"""Helpers for tests that start leantrain in other processes (the real launchers, 2-4 CPU processes on gloo over
loopback): ``from tests.processes import run, two_processes_each``. Data and model helpers are in helpers.py."""

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
from tests.helpers import REPO, model_params, process_env

BIN = Path(sys.executable).parent  # the environment's console scripts (leantrain, torchrun, accelerate)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], timeout: int = 300, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=process_env(**extra))


def train_losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r["type"] == "train"]


def assert_same_training(a: Path, b: Path, atol: float = 2e-5, loss_rel: float = 1e-5) -> None:
    """The two run folders end with the same parameters and logged the same per-step losses (to ``loss_rel``: a loss
    near 0 made of near-equal fp32 terms, such as a KL between close distributions, keeps fewer digits)."""
    pa, pb = model_params(a), model_params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-4, atol=atol, msg=k)
    assert train_losses(a) == pytest.approx(train_losses(b), rel=loss_rel)


# One torchrun launch, its 2 workers training several configs in turn: each run's process group meets at a store of
# its own (the agent's store still holds the last group's keys), and Accelerate forgets the ended group. Its port is
# picked by rank 0 just before the run and handed to rank 1 through the agent's store (not minutes before, when the
# launch starts). Twice in CI rank 1 never joined the third run's store (rank 0 timed out after 300 s); the cause is
# not known yet, so a run that takes over 2 minutes prints every thread's stack of both ranks into launch.log.
TRAIN_EACH = """\
import faulthandler, json, os, socket, sys
from datetime import timedelta
from torch.distributed import TCPStore
from accelerate.state import AcceleratorState
from leantrain import train
agent = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                 timeout=timedelta(minutes=10))
for i, (path, overrides) in enumerate(json.loads(open(sys.argv[1]).read())):
    faulthandler.dump_traceback_later(120)  # a run that hangs prints where each rank is, into launch.log
    if os.environ["RANK"] == "0":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            agent.set(f"train_each/{i}/port", str(s.getsockname()[1]))
    os.environ.update(MASTER_PORT=agent.get(f"train_each/{i}/port").decode(), TORCHELASTIC_USE_AGENT_STORE="False")
    train(path, overrides)
    AcceleratorState._reset_state(reset_partial_state=True)
    faulthandler.cancel_dump_traceback_later()
"""


def two_processes_each(root: Path, configs: dict[str, dict], *overrides: str, prelude: str = "") -> dict[str, Path]:
    """Each config written to root/<name>.yaml and trained with ``overrides`` as 2 processes into root/<name>/p2,
    all by one torchrun launch (``train_each``). ``prelude``: Python each worker runs first (registering the test
    methods of tests/method_tasks.py, say). Returns name -> the config file."""
    paths, runs = {}, []
    for name, cfg in configs.items():
        paths[name] = root / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(cfg))
        runs.append((paths[name], [*overrides, f"output_dir={root / name / 'p2'}"]))
    train_each(root, runs, prelude=prelude)
    return paths


def train_each(root: Path, runs: list[tuple[Path | None, list[str]]], prelude: str = "") -> None:
    """``train(config, overrides)`` for each of ``runs`` in turn (config None: the overrides alone), as 2 processes
    of one torchrun launch (gloo): its two workers pay their imports once for every run, not once per run. A run
    whose output folder holds checkpoints resumes, as any run does. The launch's stderr goes to root/launch.log."""
    (root / "runs.json").write_text(json.dumps([[None if path is None else str(path), list(o)] for path, o in runs]))
    script = root / "train_each.py"
    script.write_text(f"{prelude}\n{TRAIN_EACH}")
    r = run([str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()), str(script),
             str(root / "runs.json")],
            timeout=900, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]))
    (root / "launch.log").write_text(r.stderr)  # every run's log lines, for the tests that read them
    assert r.returncode == 0, r.stderr[-4000:]


def equals_one_process(path: Path, loss_rel: float = 1e-5) -> tuple[Path, Path]:
    """The config ``path`` (batch 8, micro-batch 2, 6 steps) trained in this process (1 x accumulation 4) beside its
    2-process run of ``two_processes_each``; both run folders, their training already checked equal."""
    single = train(path, [f"output_dir={path.with_suffix('') / 'single'}"])
    assert single["train"]["accumulation_steps"] == 4 and single["train"]["steps"] == 6
    a, b = path.with_suffix("") / "single", path.with_suffix("") / "p2"
    assert_same_training(a, b, loss_rel=loss_rel)
    assert json.loads((b / "summary.json").read_text())["train"]["accumulation_steps"] == 2
    return a, b
