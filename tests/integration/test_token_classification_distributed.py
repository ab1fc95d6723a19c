"""Token classification: a run killed mid-epoch and resumed is bitwise the run that was not. 1 process x
accumulation 4 == 2 processes x accumulation 2 (labelled sub-tokens of the global batch) is in
test_tasks_distributed.py."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import killed_and_resumed, make_tiny_bert, model_params, resume_args, trajectory
from tests.helpers import ner_rows, write_jsonl

pytestmark = pytest.mark.slow


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
