"""train.class_weights: weights of 1 leave the run as it is without the key; summary.json says what was used; a
killed run resumes bitwise with its fractional loss count. 1 process x accumulation 4 == 2 processes x accumulation 2
(the loss divided by the sum of the weights of the global batch) is in test_tasks_distributed.py."""

from __future__ import annotations

import json

import torch
import yaml

from tests.helpers import model_params, uneven_rows, write_rows
from leantrain import train
from leantrain.report.logs import read_metrics


def _losses(run_dir):
    return [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r["type"] == "train"]


def _config(tmp_path, tiny_bert, **train_keys) -> dict:
    return {
        "model": {"name": str(tiny_bert)},
        "data": {"train": str(write_rows(tmp_path / "train.csv", uneven_rows(42, 0))),
                 "eval": str(write_rows(tmp_path / "eval.csv", uneven_rows(13, 1)))},
        "train": {"batch_size": 8, "micro_batch_size": 2, "epochs": 1, "lr": 1e-3, "log_every_steps": 1, "seed": 7,
                  **train_keys},
        "report": {"plots": False, "progress": "plain"},
        "efficiency": {"precision": "fp32"},
    }


def test_weights_of_one_leave_the_run_unchanged(tmp_path, tiny_bert):
    cfg = _config(tmp_path, tiny_bert, max_steps=3)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    plain = train(path, [f"output_dir={tmp_path / 'plain'}"])
    ones = train(path, [f"output_dir={tmp_path / 'ones'}", "train.class_weights=[1,1]"])
    assert _losses(tmp_path / "plain") == _losses(tmp_path / "ones")  # bit for bit
    assert plain["train"]["class_weights"] is None
    assert ones["train"]["class_weights"] == [{"label": "neg", "weight": 1.0}, {"label": "pos", "weight": 1.0}]


def test_balanced_kill_and_resume_is_bitwise(tmp_path):
    """The float count of the loss since the last log (the sum of the weights) is saved and restored as is: logging
    every 3 steps, killed after step 3, resumed from the checkpoint of step 2."""
    from tests.helpers import killed_and_resumed, make_tiny_bert, resume_args, resume_data, trajectory

    make_tiny_bert(tmp_path / "bert", dropout=0.1, layers=1, hidden=16)
    ref, got = resume_data(tmp_path, "ref"), resume_data(tmp_path, "got")
    keys = ("train.class_weights=balanced", "train.log_every_steps=3")
    killed, final, summary = killed_and_resumed(got, *keys, step=3, reference=resume_args(ref, *keys))
    assert summary["train"]["steps"] == 8
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert final.returncode == 0 and "step-0000002" in final.stderr, final.stderr[-3000:]
    weights = json.loads((ref / "run" / "summary.json").read_text())["train"]["class_weights"]
    assert all(w["weight"] != 1.0 for w in weights)  # the 32 rows are not exactly balanced: the count is fractional
    assert trajectory(got / "run") == trajectory(ref / "run")
    pa, pb = model_params(ref / "run"), model_params(got / "run")
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
