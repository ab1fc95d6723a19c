"""Loading and validating the real files of ../shared/data (SST-2, MRPC): formats, quoting, labels and speed.
Missing data is a skip, or a failure under LEANTRAIN_REQUIRE_SHARED_DATA=1 (see tests/helpers.py shared_data)."""

from __future__ import annotations

import time

import pytest

from leantrain.config import DataConfig
from leantrain.data import PreparedData, load_and_validate, load_rows
from tests.helpers import shared_data

pytestmark = pytest.mark.usefixtures("own_datasets_cache")  # each test its own Arrow cache, never ~/.cache


def prepare(batch_size: int = 2, **data) -> PreparedData:
    return load_and_validate(DataConfig(**data), seed=0, batch_size=batch_size)


def test_real_sst2_dev():
    data = prepare(train=str(shared_data("sst2", "dev.tsv")))
    assert data.columns == {"text": "sentence", "text_pair": None, "label": "label"}
    assert data.label_names == ["0", "1"]
    assert (len(data.train), len(data.eval)) == (784, 88)  # 10% of 872 held out
    assert sorted(set(data.train["label"])) == [0, 1]


def test_real_mrpc_dev_pairs_with_quoted_fields():
    rows, notes = load_rows(str(shared_data("mrpc", "dev.tsv")), DataConfig(), require_labels=True, known_labels=None)
    assert rows.column_names == ["text", "text_pair", "label"] and len(rows) == 408
    assert rows[0]["text_pair"].startswith('" The foodservice pie business')  # CSV quoting undone
    assert sum(rows["label"]) == 279
    assert "text pair column: 'sentence2' (auto-detected; set data.text_pair_column to change)" in notes


def test_full_sst2_is_validated_quickly():
    start = time.perf_counter()
    data = prepare(train=str(shared_data("sst2", "train.tsv")), eval=str(shared_data("sst2", "dev.tsv")), batch_size=32)
    assert (len(data.train), len(data.eval)) == (67349, 872)
    assert sum(data.train["label"]) == 37569 and data.warnings == []
    assert time.perf_counter() - start < 15  # ~0.3 s on 2 CPU cores; a Python loop per row would not be


def test_real_mrpc_eval_against_a_model_label_set():
    rows, notes = load_rows(str(shared_data("mrpc", "dev.tsv")), DataConfig(), require_labels=True,
                            known_labels=["not_equivalent", "equivalent"])
    assert rows["label"][:2] == [1, 0]
    assert "labels: the integer labels are the model's label ids (0 = not_equivalent, 1 = equivalent)" in notes
