"""Multi-label keeps the global normalisation (examples x labels of the global batch): 1 process x accumulation 4
== 2 processes x accumulation 2 (through the real launcher, 2 CPU processes on gloo, tiny random BERT, fp32),
padding examples included."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from tests.helpers import model_params
from tests.integration.test_distributed import BIN, run
from tests.unit.modeling.test_multilabel import set_rows, write_jsonl
from leantrain import train
from leantrain.report.logs import read_metrics

pytestmark = pytest.mark.distributed


def _losses(run_dir):
    return [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r["type"] == "train"]


def test_multilabel_two_processes_accumulation_two_equals_one_process(tmp_path, tiny_bert):
    cfg = {  # 42 rows, batch 8: the last batch of 2 leaves micro-batches of padding; 13 eval rows, uneven shards
        "model": {"name": str(tiny_bert)},
        "data": {"train": str(write_jsonl(tmp_path / "train.jsonl", set_rows(42, 0))),
                 "eval": str(write_jsonl(tmp_path / "eval.jsonl", set_rows(13, 1)))},
        "train": {"batch_size": 8, "micro_batch_size": 2, "epochs": 1, "lr": 1e-3, "log_every_steps": 1, "seed": 7},
        "report": {"plots": False, "progress": "plain"},
        "efficiency": {"precision": "fp32"},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    single = train(path, [f"output_dir={tmp_path / 'single'}"])
    assert single["train"]["accumulation_steps"] == 4 and single["train"]["steps"] == 6
    r = run([str(BIN / "leantrain"), "train", str(path), "--nproc", "2", f"output_dir={tmp_path / 'p2'}"])
    assert r.returncode == 0, r.stderr[-4000:]
    a, b = tmp_path / "single", tmp_path / "p2"
    pa, pb = model_params(a), model_params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-4, atol=2e-5, msg=k)
    assert _losses(a) == pytest.approx(_losses(b), rel=1e-5)
    ea, eb = (json.loads((d / "summary.json").read_text())["eval"] for d in (a, b))
    assert ea["samples"] == eb["samples"] == 13
    for name in ("f1_micro", "f1_macro", "subset_accuracy", "loss"):
        assert ea[name] == pytest.approx(eb[name], rel=1e-5, abs=1e-6), name
    assert json.loads((b / "summary.json").read_text())["train"]["accumulation_steps"] == 2
