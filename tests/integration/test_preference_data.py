"""Preference data on real pairs: HH-RLHF transcripts (../shared/data/hh_rlhf) split into prompt and responses as the
data's README says holds for every row (the common prefix cut after its last "\\n\\nAssistant:"), including the rows
whose chosen reply itself holds that marker, and its tie dropped."""

from __future__ import annotations

import json
import os

import pytest
from transformers import AutoTokenizer

from leantrain.config import resolve
from leantrain.data.modalities import for_modality
from tests.helpers import make_tiny_chat_tokenizer, shared_data

pytestmark = pytest.mark.usefixtures("own_datasets_cache")
MARK = "\n\nAssistant:"


def split_pair(row: dict) -> tuple[str, str, str]:  # the README's rule
    p = os.path.commonprefix([row["chosen"], row["rejected"]])
    k = p.rfind(MARK) + len(MARK)
    return row["chosen"][:k], row["chosen"][k:], row["rejected"][k:]


def test_hh_rlhf_pairs_split_at_the_last_assistant_turn(tmp_path):
    lines = shared_data("hh_rlhf", "train.jsonl").read_text(encoding="utf-8").splitlines()
    picked = [*range(8), 189, 717, 327]  # 189, 717: "\n\nAssistant:" inside the chosen reply; 327: a tie
    rows = [json.loads(lines[i]) for i in picked]
    path = tmp_path / "hh.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(make_tiny_chat_tokenizer(tmp_path / "tok"))
    cfg = resolve(overrides=[f"data.train={path}", f"data.eval={path}", "data.block_size=4096"]).data
    side = for_modality("pairs")
    prepared = side.load_and_validate(cfg, seed=0, batch_size=1)
    assert prepared.columns == {"format": "implicit", "prompt": "text"}
    out = side.process(prepared.train, tok, cfg, desc="Processing train")
    assert len(out) == len(rows) - 1  # the tie is dropped
    for row, got in zip([r for i, r in zip(picked, rows) if i != 327], out):
        prompt, chosen, rejected = split_pair(row)
        for name, response in (("chosen", chosen), ("rejected", rejected)):
            ids, labels = got[f"{name}_input_ids"], got[f"{name}_labels"]
            k = next(i for i, y in enumerate(labels) if y != -100)
            assert tok.decode(ids[:k]) == prompt and tok.decode(ids[k:]) == response + tok.eos_token
            assert all(y != -100 for y in labels[k:])
        assert got["chosen_input_ids"][:k] == got["rejected_input_ids"][:k]
        assert got["chosen_input_ids"] == tok(prompt + chosen + tok.eos_token)["input_ids"]  # SFT's raw rendering
