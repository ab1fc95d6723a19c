"""Kill-and-resume, for real: `leantrain train` processes SIGKILLed at a step (or half-way through a save)
and resumed must give bitwise the same per-step losses, learning rates, grad norms, evaluations and final parameters
as an uninterrupted run. Dropout is on, so a lost RNG state would show.

Layout: 32 train rows, batch 8 (micro 4 x accumulation 2) -> 4 steps/epoch, 2 epochs = 8 steps; checkpoints every
2 steps, keep 2. One chain of processes dies twice (a SIGKILL mid-epoch, a crash half-way through a save) while the
uninterrupted reference trains in the test's own process; then the chain is resumed a second time, here."""

from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.helpers import (cli_here, make_tiny_bert, model_params, resume_args, resume_data, run_train_process,
                           train_here, trajectory, word_rows, write_rows)
from leantrain.cli import main


def _chain(folder: Path) -> list[subprocess.CompletedProcess]:
    """With DataLoader workers: killed after step 3 -> resumes mid-epoch at step 2, dies half-way through the save at
    step 6 (the processes that die); then resumes at step 4, an epoch boundary, without workers (a second resume)
    and finishes: the fixture."""
    return [run_train_process(folder, "data.num_workers=2", env={"LEANTRAIN_TEST_KILL_AT_STEP": "3"}),
            run_train_process(folder, "data.num_workers=2", env={"LEANTRAIN_TEST_CRASH_IN_SAVE": "6"})]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    make_tiny_bert(root / "bert", dropout=0.1, layers=1, hidden=16)
    ref, a = resume_data(root, "ref"), resume_data(root, "a")
    with ThreadPoolExecutor(1) as pool:  # the chain's processes meanwhile; the reference in this process
        job = pool.submit(_chain, a)
        summary = train_here(resume_args(ref))
        procs = job.result()
    procs.append(cli_here("train", *resume_args(a)))  # the resumed run that finishes, in this process
    return {"ref": (ref, summary), "a": (a, procs)}


def _assert_same_as_reference(runs, name):
    ref_dir, ref_summary = runs["ref"]
    assert ref_summary["train"]["steps"] == 8
    folder, procs = runs[name]
    assert procs[-1].returncode == 0, procs[-1].stderr[-3000:]
    ref, got = trajectory(ref_dir / "run"), trajectory(folder / "run")
    assert [r["step"] for r in got if r["type"] == "train"] == list(range(1, 9))
    assert got == ref  # bitwise: floats are written with repr
    ref_p, got_p = model_params(ref_dir / "run"), model_params(folder / "run")
    assert ref_p.keys() == got_p.keys()
    for key in ref_p:
        assert torch.equal(ref_p[key], got_p[key]), key
    summary = json.loads((folder / "run" / "summary.json").read_text())
    assert summary["train"]["steps"] == 8


def test_kill_mid_epoch_with_dataloader_workers(runs):
    _, (killed, crashed, _) = runs["a"]
    assert killed.returncode == -9, killed.stderr[-3000:]  # SIGKILL
    assert "resuming from" in crashed.stderr and "step-0000002" in crashed.stderr
    _assert_same_as_reference(runs, "a")  # steps 3-4 as the resumed process with workers logged them


def test_crash_in_save_then_resume_at_the_epoch_boundary(runs):
    folder, (_, crashed, final) = runs["a"]
    assert crashed.returncode == 137, crashed.stderr[-3000:]  # died half-way through a save
    assert "resuming from" in final.stderr and "step-0000004" in final.stderr  # the half-written step 6 is ignored
    _assert_same_as_reference(runs, "a")
    ckpts = sorted(p.name for p in (folder / "run" / "checkpoints").iterdir())
    assert ckpts == ["step-0000004", "step-0000006"]  # keep=2; the crashed save's temp folder is cleaned up


def test_auto_resume_complete_run_and_changed_config(runs, capsys):
    folder, _ = runs["a"]
    before = (folder / "run" / "metrics.jsonl").read_text()
    assert main(["train", *resume_args(folder)]) == 0  # already complete: nothing is run or rewritten
    assert (folder / "run" / "metrics.jsonl").read_text() == before
    assert main(["train", *resume_args(folder, "train.lr=0.1", "train.log_every_steps=4")]) == 2
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
        write_rows(train_csv, word_rows(32, 7, max_words=10))  # same path, other rows
        out = tmp_path / "x"
        assert main(["train", *resume_args(folder, f"checkpoint.resume={ckpt}", f"output_dir={out}")]) == 2
        err = capsys.readouterr().err
        assert "cannot resume exactly" in err and "training data changed" in err and "allow_inexact_resume" in err
        assert main(["train", *resume_args(folder, "train.batch_size=4", f"checkpoint.resume={ckpt}",
                                     f"output_dir={out}")]) == 2
        assert "train.batch_size: 8 -> 4" in capsys.readouterr().err
        assert main(["train", *resume_args(folder, f"checkpoint.resume={ckpt}", f"output_dir={out}",
                                     "checkpoint.allow_inexact_resume=true", "checkpoint.every_steps=0")]) == 0
        assert json.loads((out / "summary.json").read_text())["train"]["resumed_from_step"] == 4
    finally:
        train_csv.write_text(original)


def test_corrupt_checkpoint_refused_and_auto_falls_back(runs, tmp_path, capsys):
    from leantrain.config import resolve
    from leantrain.engine.checkpoint.resume import decide_here

    folder, _ = runs["a"]
    run = tmp_path / "run"
    shutil.copytree(folder / "run" / "checkpoints", run / "checkpoints")
    newest = run / "checkpoints" / "step-0000006"
    with (newest / "model.safetensors").open("r+b") as f:  # one flipped byte
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 1]))
    assert main(["train", *resume_args(folder, f"checkpoint.resume={newest}", f"output_dir={tmp_path / 'y'}")]) == 2
    assert "does not match its checksum" in capsys.readouterr().err
    cfg = resolve(None, resume_args(folder, f"output_dir={run}"))
    decision = decide_here(cfg, run)
    assert decision.kind == "resume" and decision.path.name == "step-0000004"
