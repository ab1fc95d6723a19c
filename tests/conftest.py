"""Shared fixtures: a tiny random BERT folder (built from a config, no download), paths to shared data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach for the Hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def shared_data(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not found: {path}")
    return path


def make_tiny_bert(folder: Path, *, dropout: float = 0.0, layers: int = 2, hidden: int = 32) -> Path:
    """A 2-layer, hidden-32 BERT with random weights and the packaged MiniLM's tokenizer, saved as a base model."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from leantrain.modeling import packaged_model_path

    tok = AutoTokenizer.from_pretrained(packaged_model_path())
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=256,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def minilm() -> str:
    from leantrain.modeling import packaged_model_path

    return packaged_model_path()


def write_rows(path: Path, rows: list[dict], sep: str = ",") -> Path:
    import csv

    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=sep)
        w.writeheader()
        w.writerows(rows)
    return path
