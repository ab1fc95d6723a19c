"""Kill-and-resume, for real: `python -m leantrain train` processes SIGKILLed at a step (or half-way through a save)
and resumed must give bitwise the same per-step losses, learning rates, grad norms, evaluations and final parameters
as an uninterrupted run. Dropout is on, so a lost RNG state would show.

Layout: 32 train rows, batch 8 (micro 4 x accumulation 2) -> 4 steps/epoch, 2 epochs = 8 steps; checkpoints every
2 steps, keep 2. The three process chains run concurrently (each process uses one thread)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from conftest import make_tiny_bert, write_rows
from leantrain.cli import main
from leantrain.report.logs import read_metrics

WORDS = {"pos": ["great", "lovely", "superb", "fine"], "neg": ["awful", "bad", "broken", "poor"]}


def _rows(n, seed):
    import random

    r = random.Random(seed)
    out = []
    for _ in range(n):
        lab = r.choice(["pos", "neg"])
        out.append({"text": " ".join(r.choice(WORDS[lab]) for _ in range(r.randint(1, 10))), "label": lab})
    return out


def _args(folder: Path, *extra: str) -> list[str]:
    return [f"model.name={folder.parent / 'bert'}", f"data.train={folder / 'train.csv'}",
            f"data.eval={folder / 'dev.csv'}", "train.batch_size=8", "train.micro_batch_size=4", "train.epochs=2",
            "train.lr=2e-3", "train.log_every_steps=1", "checkpoint.every_steps=2", "checkpoint.keep=2",
            "checkpoint.keep_final=2",  # these tests resume from a finished run's checkpoints
            "report.plots=false", "report.progress=none", f"output_dir={folder / 'run'}", *extra]


def _data(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    write_rows(folder / "train.csv", _rows(32, 0))
    write_rows(folder / "dev.csv", _rows(8, 1))
    return folder


def _run(folder: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    return subprocess.run([sys.executable, "-m", "leantrain", "train", *_args(folder, *extra)], env=full,
                          capture_output=True, text=True, timeout=300)


def _chain_a(folder: Path) -> list[subprocess.CompletedProcess]:
    """Killed after step 5 -> resumes at step 4 (an epoch boundary), dies half-way through the save at step 6 ->
    resumes at step 4 again (a second resume) and finishes."""
    return [_run(folder, env={"LEANTRAIN_TEST_KILL_AT_STEP": "5"}),
            _run(folder, env={"LEANTRAIN_TEST_CRASH_IN_SAVE": "6"}),
            _run(folder)]


def _chain_b(folder: Path) -> list[subprocess.CompletedProcess]:
    """DataLoader workers; killed after step 3 -> resumes mid-epoch at step 2."""
    return [_run(folder, "data.num_workers=2", env={"LEANTRAIN_TEST_KILL_AT_STEP": "3"}),
            _run(folder, "data.num_workers=2")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    make_tiny_bert(root / "bert", dropout=0.1, layers=1, hidden=16)
    ref, a, b = _data(root, "ref"), _data(root, "a"), _data(root, "b")
    with ThreadPoolExecutor(3) as pool:
        jobs = [pool.submit(lambda: [_run(ref)]), pool.submit(_chain_a, a), pool.submit(_chain_b, b)]
        results = [j.result() for j in jobs]
    return {"ref": (ref, results[0]), "a": (a, results[1]), "b": (b, results[2])}


def _trajectory(run: Path) -> list[dict]:
    keep = ("type", "step", "loss", "lr", "grad_norm", "eval.loss", "eval.accuracy", "eval.f1_macro")
    return [{k: r[k] for k in keep if k in r} for r in read_metrics(run / "metrics.jsonl")]


def _params(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "model" / "model.safetensors"))


def _assert_same_as_reference(runs, name):
    ref_dir, (ref_proc,) = runs["ref"]
    assert ref_proc.returncode == 0, ref_proc.stderr[-3000:]
    folder, procs = runs[name]
    assert procs[-1].returncode == 0, procs[-1].stderr[-3000:]
    ref, got = _trajectory(ref_dir / "run"), _trajectory(folder / "run")
    assert [r["step"] for r in got if r["type"] == "train"] == list(range(1, 9))
    assert got == ref  # bitwise: floats are written with repr
    ref_p, got_p = _params(ref_dir / "run"), _params(folder / "run")
    assert ref_p.keys() == got_p.keys()
    for key in ref_p:
        assert torch.equal(ref_p[key], got_p[key]), key
    summary = json.loads((folder / "run" / "summary.json").read_text())
    assert summary["train"]["steps"] == 8


def test_kill_at_epoch_boundary_crash_in_save_and_resume_twice(runs):
    folder, (killed, crashed, final) = runs["a"]
    assert killed.returncode == -9, killed.stderr[-3000:]  # SIGKILL
    assert crashed.returncode == 137, crashed.stderr[-3000:]  # died half-way through a save
    assert "resuming from" in crashed.stderr and "step-0000004" in crashed.stderr
    assert "resuming from" in final.stderr and "step-0000004" in final.stderr  # the half-written step 6 is ignored
    _assert_same_as_reference(runs, "a")
    ckpts = sorted(p.name for p in (folder / "run" / "checkpoints").iterdir())
    assert ckpts == ["step-0000004", "step-0000006"]  # keep=2; the crashed save's temp folder is cleaned up


def test_kill_mid_epoch_with_dataloader_workers(runs):
    _, (killed, final) = runs["b"]
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert "step-0000002" in final.stderr
    _assert_same_as_reference(runs, "b")


def test_auto_resume_complete_run_and_changed_config(runs, capsys):
    folder, _ = runs["a"]
    before = (folder / "run" / "metrics.jsonl").read_text()
    assert main(["train", *_args(folder)]) == 0  # already complete: nothing is run or rewritten
    assert (folder / "run" / "metrics.jsonl").read_text() == before
    assert main(["train", *_args(folder, "train.lr=0.1", "train.log_every_steps=4")]) == 2
    err = capsys.readouterr().err
    assert "train.lr: 0.002 -> 0.1" in err and "log_every_steps" not in err  # cadence keys do not count


def _copy_checkpoint(runs, tmp_path, step="step-0000004") -> Path:
    folder, _ = runs["a"]
    dst = tmp_path / step
    shutil.copytree(folder / "run" / "checkpoints" / step, dst)
    return dst


def test_refuses_changed_data_unless_allowed(runs, tmp_path, capsys):
    folder, _ = runs["a"]
    ckpt = _copy_checkpoint(runs, tmp_path)
    train_csv = folder / "train.csv"
    original = train_csv.read_text()
    try:
        write_rows(train_csv, _rows(32, 7))  # same path, other rows
        out = tmp_path / "x"
        assert main(["train", *_args(folder, f"checkpoint.resume={ckpt}", f"output_dir={out}")]) == 2
        err = capsys.readouterr().err
        assert "cannot resume exactly" in err and "training data changed" in err and "allow_inexact_resume" in err
        assert main(["train", *_args(folder, "train.batch_size=4", f"checkpoint.resume={ckpt}",
                                     f"output_dir={out}")]) == 2
        assert "train.batch_size: 8 -> 4" in capsys.readouterr().err
        assert main(["train", *_args(folder, f"checkpoint.resume={ckpt}", f"output_dir={out}",
                                     "checkpoint.allow_inexact_resume=true", "checkpoint.every_steps=0")]) == 0
        assert json.loads((out / "summary.json").read_text())["train"]["resumed_from_step"] == 4
    finally:
        train_csv.write_text(original)


def test_corrupt_checkpoint_refused_and_auto_falls_back(runs, tmp_path, capsys):
    from leantrain.config import resolve
    from leantrain.engine.resume import _decide

    folder, _ = runs["a"]
    run = tmp_path / "run"
    shutil.copytree(folder / "run" / "checkpoints", run / "checkpoints")
    newest = run / "checkpoints" / "step-0000006"
    with (newest / "model.safetensors").open("r+b") as f:  # one flipped byte
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 1]))
    assert main(["train", *_args(folder, f"checkpoint.resume={newest}", f"output_dir={tmp_path / 'y'}")]) == 2
    assert "does not match its checksum" in capsys.readouterr().err
    cfg = resolve(None, _args(folder, f"output_dir={run}"))
    decision = _decide(cfg, run)
    assert decision.kind == "resume" and decision.path.name == "step-0000004"
