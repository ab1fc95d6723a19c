"""Multi-label kill-and-resume: a `leantrain train` process with 0/1 label columns, train.pos_weight=balanced
and the tuned threshold, SIGKILLed mid-epoch and resumed, gives bitwise the per-step losses, evaluations (tuned
threshold, per-label F1) and final parameters of an uninterrupted run (see test_resume.py for the layout)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from tests.helpers import (killed_and_resumed, make_tiny_bert, model_params, resume_args, trajectory,
                           write_rows)

LABELS = ["joy", "love", "anger"]
EXTRA = (f"data.label_column=[{','.join(LABELS)}]", "train.pos_weight=balanced")


def rows(n: int, seed: int) -> list[dict]:
    r = random.Random(seed)
    out = []
    for _ in range(n):
        on = [name for name in LABELS if r.random() < 0.4]
        words = [w for w in on for _ in range(r.randint(1, 2))] or ["plain"]
        r.shuffle(words)
        out.append({"text": " ".join(words), **{name: int(name in on) for name in LABELS}})
    return out


@pytest.mark.slow
def test_multilabel_kill_mid_epoch_and_resume_is_bitwise(tmp_path):
    make_tiny_bert(tmp_path / "bert", dropout=0.1, layers=1, hidden=16)
    folders = []
    for name in ("ref", "killed"):
        folder = tmp_path / name
        folder.mkdir()
        write_rows(folder / "train.csv", rows(32, 0))
        write_rows(folder / "dev.csv", rows(8, 1))
        folders.append(folder)
    ref, killed = folders
    *chain, ref_summary = killed_and_resumed(killed, *EXTRA, step=3, reference=resume_args(ref, *EXTRA))
    assert ref_summary["train"]["steps"] == 8
    assert chain[0].returncode == -9, chain[0].stderr[-3000:]  # SIGKILL after step 3
    assert chain[1].returncode == 0, chain[1].stderr[-3000:]
    assert "resuming from" in chain[1].stderr and "step-0000002" in chain[1].stderr  # mid-epoch (4 steps/epoch)
    want, got = trajectory(ref / "run"), trajectory(killed / "run")
    assert [r["step"] for r in got if r["type"] == "train"] == list(range(1, 9))
    assert got == want  # bitwise: floats are written with repr
    from leantrain.report.logs import read_metrics

    keep = ("step", "eval.f1_micro", "eval.threshold", "eval.f1_per_label", "eval.f1_micro_untuned")
    evals = [[{k: r[k] for k in keep if k in r} for r in read_metrics(f / "run" / "metrics.jsonl")
              if "eval.threshold" in r] for f in (ref, killed)]
    assert evals[0] and evals[1] == evals[0]
    assert all(set(r["eval.f1_per_label"]) == set(LABELS) for r in evals[1])
    want_p, got_p = model_params(ref / "run"), model_params(killed / "run")
    assert want_p.keys() == got_p.keys()
    for key in want_p:
        assert torch.equal(want_p[key], got_p[key]), key
    summary = json.loads((killed / "run" / "summary.json").read_text())
    assert [w["label"] for w in summary["train"]["pos_weight"]] == LABELS
    config = json.loads((killed / "run" / "model" / "config.json").read_text())
    assert config["threshold"] == summary["eval"]["threshold"]
