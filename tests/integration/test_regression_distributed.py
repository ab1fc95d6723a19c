"""Text regression keeps the global normalisation: 1 process x accumulation 4 == 2 processes x accumulation 2
(through the real launcher, 2 CPU processes on gloo, tiny random BERT, fp32), padding examples included."""

from __future__ import annotations

import json

import pytest

from tests.helpers import write_rows
from tests.processes import one_and_two_processes
from tests.helpers import score_rows

pytestmark = pytest.mark.distributed


def test_regression_two_processes_accumulation_two_equals_one_process(tmp_path, tiny_bert):
    cfg = {  # 42 rows, batch 8: the last batch of 2 leaves micro-batches of padding; 13 eval rows, uneven shards
        "model": {"name": str(tiny_bert)},
        "data": {"train": str(write_rows(tmp_path / "train.csv", score_rows(42, 0))),
                 "eval": str(write_rows(tmp_path / "eval.csv", score_rows(13, 1))), "label_column": "score"},
        "train": {"batch_size": 8, "micro_batch_size": 2, "epochs": 1, "lr": 1e-3, "log_every_steps": 1, "seed": 7},
        "report": {"plots": False, "progress": "plain"},
        "efficiency": {"precision": "fp32"},
    }
    a, b = one_and_two_processes(tmp_path, cfg)
    ea, eb = (json.loads((d / "summary.json").read_text())["eval"] for d in (a, b))
    assert ea["samples"] == eb["samples"] == 13
    # mse pins the predictions (equal to ~1e-9 here); pearson of 13 nearly constant predictions divides by their tiny
    # spread, so the last-bit differences of the 2-process sums move it by ~1e-4
    assert ea["mse"] == pytest.approx(eb["mse"], rel=1e-5) and ea["pearson"] == pytest.approx(eb["pearson"], abs=1e-3)


def test_huber_loss_and_standardised_targets_two_processes_equal_one(tmp_path, tiny_bert):
    """train.loss=huber with data.standardize_targets: each process standardises with the same training-split mean
    and std, and the Huber sum / global example count keeps 1 x 4 == 2 x 2."""
    cfg = {
        "model": {"name": str(tiny_bert)},
        "data": {"train": str(write_rows(tmp_path / "train.csv", score_rows(42, 0))),
                 "eval": str(write_rows(tmp_path / "eval.csv", score_rows(13, 1))), "label_column": "score",
                 "standardize_targets": True},
        "train": {"batch_size": 8, "micro_batch_size": 2, "epochs": 1, "lr": 1e-3, "log_every_steps": 1, "seed": 7,
                  "loss": "huber", "huber_delta": 0.5},
        "report": {"plots": False, "progress": "plain"},
        "efficiency": {"precision": "fp32"},
    }
    a, b = one_and_two_processes(tmp_path, cfg)
    ea, eb = (json.loads((d / "summary.json").read_text())["eval"] for d in (a, b))
    assert ea["samples"] == eb["samples"] == 13
    assert ea["loss"] == pytest.approx(eb["loss"], rel=1e-5) and ea["mse"] == pytest.approx(eb["mse"], rel=1e-5)
    za, zb = (json.loads((d / "model" / "config.json").read_text())["target_standardization"] for d in (a, b))
    assert za == zb
