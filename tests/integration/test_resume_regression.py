"""Kill-and-resume for text regression (Huber loss, standardised targets): a `leantrain train` process
SIGKILLed mid-epoch and resumed gives bitwise the same per-step losses, learning rates, grad norms, evaluations and
final parameters as an uninterrupted run, and the same target standardisation in the saved config.

Layout as tests/integration/test_resume.py: 32 train rows, batch 8 (micro 4 x accumulation 2) -> 4 steps/epoch,
2 epochs = 8 steps; checkpoints every 2 steps; killed after step 3 -> resumes at step 2."""

from __future__ import annotations

import json

import pytest
import torch

from leantrain.report.logs import read_metrics
from tests.helpers import (killed_and_resumed, make_tiny_bert, model_params, resume_args, score_rows,
                           write_rows)

REGRESSION = ("train.loss=huber", "train.huber_delta=0.5", "data.standardize_targets=true")
pytestmark = pytest.mark.slow  # two training processes and a resumed one: ~2 min on a shared 2-core CPU

KEEP = ("type", "step", "loss", "lr", "grad_norm", "eval.loss", "eval.mse", "eval.mae", "eval.pearson")


def _data(root, name):
    folder = root / name
    folder.mkdir()
    write_rows(folder / "train.csv", [{"text": r["text"], "label": r["score"]} for r in score_rows(32, 0)])
    write_rows(folder / "dev.csv", [{"text": r["text"], "label": r["score"]} for r in score_rows(8, 1)])
    return folder


def test_regression_kill_mid_epoch_and_resume_is_bitwise(tmp_path):
    make_tiny_bert(tmp_path / "bert", dropout=0.1, layers=1, hidden=16)
    ref, chain = _data(tmp_path, "ref"), _data(tmp_path, "chain")
    killed, final, ref_summary = killed_and_resumed(chain, *REGRESSION, step=3, reference=resume_args(ref, *REGRESSION))
    assert ref_summary["train"]["steps"] == 8
    assert killed.returncode == -9, killed.stderr[-3000:]  # SIGKILL
    assert final.returncode == 0 and "resuming from" in final.stderr and "step-0000002" in final.stderr, \
        final.stderr[-3000:]
    assert "task: text-regression" in final.stderr
    got, want = ([{k: r[k] for k in KEEP if k in r} for r in read_metrics(f / "run" / "metrics.jsonl")]
                 for f in (chain, ref))
    assert [r["step"] for r in got if r["type"] == "train"] == list(range(1, 9))
    assert any("eval.mse" in r for r in got)
    assert got == want  # bitwise: floats are written with repr
    want_p, got_p = model_params(ref / "run"), model_params(chain / "run")
    assert want_p.keys() == got_p.keys() and all(torch.equal(want_p[k], got_p[k]) for k in want_p)
    configs = [json.loads((f / "run" / "model" / "config.json").read_text()) for f in (ref, chain)]
    assert configs[0]["target_standardization"] == configs[1]["target_standardization"]
    assert configs[1]["problem_type"] == "regression"
