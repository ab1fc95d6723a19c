"""Multi-label keeps the global normalisation (examples x labels of the global batch): 1 process x accumulation 4
== 2 processes x accumulation 2 (through the real launcher, 2 CPU processes on gloo, tiny random BERT, fp32),
padding examples included."""

from __future__ import annotations

import json

import pytest

from tests.processes import one_and_two_processes
from tests.helpers import set_rows, write_jsonl

pytestmark = pytest.mark.distributed


def test_multilabel_two_processes_accumulation_two_equals_one_process(tmp_path, tiny_bert):
    cfg = {  # 42 rows, batch 8: the last batch of 2 leaves micro-batches of padding; 13 eval rows, uneven shards
        "model": {"name": str(tiny_bert)},
        "data": {"train": str(write_jsonl(tmp_path / "train.jsonl", set_rows(42, 0))),
                 "eval": str(write_jsonl(tmp_path / "eval.jsonl", set_rows(13, 1)))},
        "train": {"batch_size": 8, "micro_batch_size": 2, "epochs": 1, "lr": 1e-3, "log_every_steps": 1, "seed": 7},
        "report": {"plots": False, "progress": "plain"},
        "efficiency": {"precision": "fp32"},
    }
    a, b = one_and_two_processes(tmp_path, cfg)
    ea, eb = (json.loads((d / "summary.json").read_text())["eval"] for d in (a, b))
    assert ea["samples"] == eb["samples"] == 13
    for name in ("f1_micro", "f1_macro", "subset_accuracy", "loss"):
        assert ea[name] == pytest.approx(eb[name], rel=1e-5, abs=1e-6), name
