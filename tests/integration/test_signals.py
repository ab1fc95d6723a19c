"""Preemption and processes that outlive their run (issue 17, items 1 and 3).

- SIGTERM / SIGINT during training: the step finishes, a checkpoint is written at that step, the run exits 75, and
  the resume is bitwise equal to an uninterrupted run (1 process here; 2 processes where only rank 1 gets the
  signal, so the ranks must agree on the step, in test_resume_distributed.py beside its shared 2-process reference).
- A second signal aborts at once.
- Stopping a ``--nproc 2`` launcher with SIGTERM, SIGINT or SIGKILL leaves no process of the run and writes no
  model/ or summary.json afterwards; SIGTERM / SIGINT print no traceback (torchrun's SignalException).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.helpers import (cli_here, make_tiny_bert, model_params, resume_args, resume_data, run_train_process,
                           train_here, trajectory)

TWO = ("--nproc", "2", "train.micro_batch_size=2", "efficiency.precision=fp32")
GLOO = {"GLOO_SOCKET_IFNAME": "lo"}


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("signals")
    make_tiny_bert(root / "bert", dropout=0.1, layers=1, hidden=16)
    return root


def _ckpts(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "run" / "checkpoints").iterdir())


def _same(ref: Path, got: Path) -> None:
    assert trajectory(got / "run") == trajectory(ref / "run")
    a, b = model_params(ref / "run"), model_params(got / "run")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_then_sigint_checkpoint_and_resume_bitwise_one_process(bert):
    ref, chain = resume_data(bert, "ref1"), resume_data(bert, "chain1")
    with ThreadPoolExecutor(1) as pool:  # the first process meanwhile; the reference in this process
        term_job = pool.submit(run_train_process, chain, env={"LEANTRAIN_TEST_SIGNAL_AT_STEP": "TERM@3"})
        assert train_here(resume_args(ref))["train"]["steps"] == 8
        term = term_job.result()
    assert term.returncode == 75, term.stderr[-3000:]
    assert "got SIGTERM" in term.stderr and "stopped by SIGTERM after step 3" in term.stderr
    assert "step-0000003" in _ckpts(chain) and not (chain / "run" / "summary.json").exists()
    sigint = cli_here("train", *resume_args(chain), LEANTRAIN_TEST_SIGNAL_AT_STEP="INT@5")
    assert sigint.returncode == 75, sigint.stderr[-3000:]
    assert "resuming from" in sigint.stderr and "step-0000003" in sigint.stderr
    assert "stopped by SIGINT after step 5" in sigint.stderr and "step-0000005" in _ckpts(chain)
    final = cli_here("train", *resume_args(chain))  # both resumes in this process
    assert final.returncode == 0, final.stderr[-3000:]
    assert "step-0000005" in final.stderr
    _same(ref, chain)


class _Acc:
    num_processes, process_index, is_main_process = 1, 0, True

    class device:  # noqa: N801
        type = "cpu"


def test_second_signal_aborts_at_once():
    from leantrain.engine.checkpoint.preempt import Preemption

    pre = Preemption(_Acc(), None, 10, lambda step: False)
    before = signal.getsignal(signal.SIGINT)
    pre.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert pre.agreed(1) == signal.SIGINT  # the first only sets the flag
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler as soon as the call returns
    finally:
        pre.uninstall()
    assert signal.getsignal(signal.SIGINT) == before


def _wait_for_lines(stream, pattern: str, n: int, what: str) -> None:
    """Read ``stream`` until ``n`` lines match ``pattern``; each read blocks until the process writes (no sleep).
    A process that ends first fails the test with the end of its output."""
    seen, tail = 0, []
    for line in stream:
        tail = (tail + [line])[-40:]
        seen += bool(re.search(pattern, line))
        if seen >= n:
            return
    raise AssertionError(f"the run ended before {what}:\n{''.join(tail)}")


@pytest.mark.distributed
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_stopping_the_launcher_leaves_no_worker(bert, sig):
    import psutil

    folder = resume_data(bert, f"launcher-{sig.name}")
    run = folder / "run"
    env = {**os.environ, **GLOO, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "leantrain", "train", *resume_args(folder, *TWO, "train.max_steps=100000",
                                                              "train.epochs=1", "report.progress=plain")]
    launcher = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    procs = []
    try:
        _wait_for_lines(launcher.stderr, r"step \d+/\d+", 2, "two logged steps")
        assert launcher.poll() is None, launcher.stderr.read()[-3000:]
        procs = psutil.Process(launcher.pid).children(recursive=True)  # torchrun's agent and both workers
        assert len(procs) >= 3, procs
        os.kill(launcher.pid, sig)
        _, err = launcher.communicate(timeout=240)
        gone, alive = psutil.wait_procs(procs, timeout=120)
        assert not alive, alive
    finally:  # never leave a process behind, even when the test fails
        for proc in [*procs, psutil.Process(launcher.pid)] if launcher.poll() is None else procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
    if sig == signal.SIGKILL:
        assert launcher.returncode == -9
    else:
        assert launcher.returncode == 75, err[-3000:]
        assert f"stopped by {sig.name}" in err
        assert "Traceback" not in err and "SignalException" not in err, err[-3000:]  # torchrun's (issue 35 item 13)
        assert any(p.name.startswith("step-") for p in (run / "checkpoints").iterdir())
    assert not (run / "model").exists() and not (run / "summary.json").exists()
