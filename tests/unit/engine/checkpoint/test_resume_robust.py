"""Resume robustness (issue 17, items 4-7): a damaged metrics.jsonl, a rerun with checkpoint.resume=never that is
interrupted, a deleted manifest, an interrupted prune, and a full disk during a save."""

from __future__ import annotations

import errno
import json
import logging
import shutil
from pathlib import Path

import pytest

from tests.helpers import word_rows, write_rows
from leantrain.cli import main


def _args(tiny_bert, data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", f"model.name={tiny_bert}", f"data.train={data / 'train.csv'}", "train.batch_size=8",
            "train.max_steps=6", "train.log_every_steps=1", "checkpoint.every_steps=2", "checkpoint.keep=2",
            "checkpoint.keep_final=2", "report.plots=false", "report.progress=none", f"output_dir={out}", *extra]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("robust-data")
    write_rows(folder / "train.csv", word_rows(24, 0, max_words=10))
    return folder


@pytest.fixture(scope="module")
def finished(tiny_bert, data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("robust") / "run"
    assert main(_args(tiny_bert, data, out)) == 0
    return out


# --- 4: a damaged metrics.jsonl -----------------------------------------------------------------------------------
def test_damaged_metrics_log_is_skipped_with_a_warning(tmp_path, caplog):
    from leantrain.engine.checkpoint.resume import prior_records
    from leantrain.engine.training.loop_state import LoopState

    good = [{"type": "train", "step": s, "loss": 0.5} for s in range(1, 6)]
    lines = [json.dumps(r) for r in good]
    lines.insert(2, "\x00\x00garbage{{")  # damage mid-file
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"type": "train", "st')  # and a half-written line
    with caplog.at_level(logging.WARNING, logger="leantrain"):
        records = prior_records(tmp_path, LoopState(step=4, resumed_from=tmp_path / "checkpoints" / "step-0000004"))
    assert records == good[:4]
    assert "skipping 2 damaged line(s) (line 3, 7)" in caplog.text


# --- 5: a checkpoint.resume=never rerun in a finished output_dir, interrupted, auto-resumes -------------------------
def test_interrupted_never_rerun_in_finished_dir_auto_resumes(tiny_bert, data, finished, tmp_path, monkeypatch,
                                                               capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    monkeypatch.setenv("LEANTRAIN_TEST_SIGNAL_AT_STEP", "TERM@3")
    assert main(_args(tiny_bert, data, out, "checkpoint.resume=never", "train.lr=1e-3")) == 75
    monkeypatch.delenv("LEANTRAIN_TEST_SIGNAL_AT_STEP")
    capsys.readouterr()
    assert main(_args(tiny_bert, data, out)) == 2  # the old run's config: it is not this folder's run any more
    err = capsys.readouterr().err
    assert "train.lr: 0.001 -> " in err  # compared with the newest checkpoint's own config (the interrupted run)
    assert "resume=never" not in err  # never propose a command that deletes the checkpoints
    assert main(_args(tiny_bert, data, out, "train.lr=1e-3")) == 0  # the interrupted run's own config resumes
    assert "resuming from" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["train"]["resumed_from_step"] == 3 and summary["train"]["steps"] == 6


# --- 6: a deleted manifest is reported; an interrupted prune leaves nothing half-deleted ----------------------------
def test_deleted_manifest_is_reported_and_auto_falls_back(tiny_bert, data, finished, tmp_path, caplog):
    from leantrain.config import resolve
    from leantrain.engine.checkpoint.resume import decide_here

    run = tmp_path / "run"
    shutil.copytree(finished / "checkpoints", run / "checkpoints")
    newest = run / "checkpoints" / "step-0000004"
    (newest / "manifest.json").unlink()
    cfg = resolve(None, _args(tiny_bert, data, run)[1:])
    with caplog.at_level(logging.WARNING, logger="leantrain"):
        decision = decide_here(cfg, run)
    assert decision.kind == "resume" and decision.path.name == "step-0000002"
    assert "step-0000004: manifest.json is missing" in caplog.text


def _fake_checkpoint(root: Path, step: int) -> Path:
    folder = root / f"step-{step:07d}"
    folder.mkdir(parents=True)
    for name in ("manifest.json", "model.safetensors", "trainer_state.json"):
        (folder / name).write_text("{}")
    return folder


def test_interrupted_prune_leaves_no_half_deleted_checkpoint(tmp_path, monkeypatch):
    from leantrain.engine.checkpoint import save as ck

    root = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        _fake_checkpoint(root, step)
    saver = ck.Checkpointer.__new__(ck.Checkpointer)
    saver.root, saver.keep = root, 2

    def killed_half_way(path, ignore_errors=False):  # deletes the first file it meets, then the process "dies"
        if not Path(path).exists():
            return
        first = sorted(Path(path).iterdir())[0]
        first.unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(ck.shutil, "rmtree", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        saver._prune()
    monkeypatch.undo()
    steps = [p for p in root.iterdir() if p.name.startswith("step-")]
    assert all((p / "manifest.json").is_file() and len(list(p.iterdir())) == 3 for p in steps), steps
    assert sorted(p.name for p in steps) == ["step-0000004", "step-0000006"]
    ck.clean_leftovers(root)  # at the next start
    assert sorted(p.name for p in root.iterdir()) == ["step-0000004", "step-0000006"]


def test_clean_leftovers_restores_a_step_moved_aside_for_its_replacement(tmp_path):
    from leantrain.engine.checkpoint.save import clean_leftovers

    root = tmp_path / "checkpoints"
    old = _fake_checkpoint(root, 4)
    old.rename(root / ".old-step-0000004")  # killed between the two renames of a re-save of step 4
    (root / ".tmp-step-0000006").mkdir()
    clean_leftovers(root)
    assert sorted(p.name for p in root.iterdir()) == ["step-0000004"]


# --- 7: disk full during a save ---------------------------------------------------------------------------------
def test_disk_full_during_save_exits_2_and_keeps_the_previous_checkpoint(tiny_bert, data, tmp_path, monkeypatch,
                                                                          capsys):
    import safetensors.torch

    from leantrain.engine.checkpoint.save import verify

    real, calls = safetensors.torch.save_model, []

    def full_disk_on_second_save(model, filename, *a, **k):
        calls.append(filename)
        if len(calls) == 2:
            Path(filename).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device", filename)
        return real(model, filename, *a, **k)

    monkeypatch.setattr(safetensors.torch, "save_model", full_disk_on_second_save)
    out = tmp_path / "run"
    assert main(_args(tiny_bert, data, out)) == 2
    err = capsys.readouterr().err
    ckpts = out / "checkpoints"
    assert (f"disk full while saving checkpoint step 4 to {ckpts / 'step-0000004'}; the previous checkpoint (step 2) "
            "is intact") in err
    assert "Traceback" not in err
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000002"]  # the partial folder is gone
    verify(ckpts / "step-0000002")
    assert not (out / "summary.json").exists()
