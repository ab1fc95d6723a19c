"""Token classification keeps the global normalisation (labelled sub-tokens of the global batch): 1 process x
accumulation 4 == 2 processes x accumulation 2 through the real launcher (2 CPU processes on gloo, tiny random BERT,
fp32, padding examples and uneven eval shards of different widths included); and a run killed mid-epoch and
resumed is bitwise the run that was not."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import killed_and_resumed, make_tiny_bert, model_params, resume_args, trajectory
from tests.processes import one_and_two_processes
from tests.helpers import ner_rows, write_jsonl

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_token_classification_two_processes_accumulation_two_equals_one_process(tmp_path, tiny_bert):
    cfg = {  # 42 rows, batch 8: the last batch of 2 leaves micro-batches of padding; 13 eval rows, uneven shards
        "model": {"name": str(tiny_bert)},
        "data": {"train": str(write_jsonl(tmp_path / "train.jsonl", ner_rows(42, 0))),
                 "eval": str(write_jsonl(tmp_path / "eval.jsonl", ner_rows(13, 1)))},
        "train": {"batch_size": 8, "micro_batch_size": 2, "epochs": 1, "lr": 3e-3, "log_every_steps": 1, "seed": 7},
        "report": {"plots": False, "progress": "plain"},
        "efficiency": {"precision": "fp32"},
    }
    a, b = one_and_two_processes(tmp_path, cfg)
    ea, eb = (json.loads((d / "summary.json").read_text())["eval"] for d in (a, b))
    assert ea["samples"] == eb["samples"] == 13
    assert ea["entity_f1"] == eb["entity_f1"] and ea["token_accuracy"] == eb["token_accuracy"]
    assert ea["loss"] == pytest.approx(eb["loss"], rel=1e-5)


def test_token_classification_kill_mid_epoch_and_resume_is_bitwise(tmp_path):
    """32 rows, batch 8 -> 4 steps/epoch, 2 epochs; killed after step 3, resumed from step 2 (mid-epoch)."""
    make_tiny_bert(tmp_path / "bert", dropout=0.1, layers=1, hidden=16)
    runs = {}
    for name in ("ref", "killed"):
        folder = tmp_path / name
        folder.mkdir()
        data = [f"data.train={write_jsonl(folder / 'train.jsonl', ner_rows(32, 0))}",
                f"data.eval={write_jsonl(folder / 'dev.jsonl', ner_rows(8, 1))}"]
        runs[name] = (folder, data)
    ref, ref_data = runs["ref"]
    folder, data = runs["killed"]
    killed, final, summary = killed_and_resumed(folder, *data, step=3, reference=resume_args(ref, *ref_data))
    assert summary["train"]["steps"] == 8
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert final.returncode == 0, final.stderr[-3000:]
    assert "resuming from" in final.stderr and "step-0000002" in final.stderr
    got, want = trajectory(folder / "run"), trajectory(ref / "run")
    assert [r["step"] for r in got if r["type"] == "train"] == list(range(1, 9))
    assert got == want  # bitwise: floats are written with repr
    ref_p, got_p = model_params(ref / "run"), model_params(folder / "run")
    for key in ref_p:
        assert torch.equal(ref_p[key], got_p[key]), key
    ea, eb = (json.loads((d / "run" / "summary.json").read_text())["eval"] for d in (ref, folder))
    assert ea["entity_f1"] == eb["entity_f1"] and ea["loss"] == eb["loss"]
