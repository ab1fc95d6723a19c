"""Token classification on the real CoNLL-2003 files of ../shared/data/conll2003: the raw CoNLL column file (no
extension, 4 columns, -DOCSTART- lines) reads to exactly the JSONL sentences. (Training MiniLM on a slice is not
here: 480 sentences x 2 epochs took 6 minutes on the shared 2-core machine; benchmarks/against/ner_vs_trainer.py does it.)"""

from __future__ import annotations

import json

import pytest

from leantrain.config import DataConfig
from tests.helpers import shared_data

pytestmark = pytest.mark.usefixtures("own_datasets_cache")


def test_raw_conll_file_reads_as_the_jsonl_sentences():
    from leantrain.data.tagged import load_rows

    rows, notes = load_rows(str(shared_data("conll2003", "raw", "eng.testa")), DataConfig(), require_labels=True,
                            known_labels=None)
    want = [json.loads(line) for line in shared_data("conll2003", "validation.jsonl").read_text().splitlines()]
    assert len(rows) == len(want) == 3250
    assert rows["tokens"] == [w["tokens"] for w in want]
    names = notes[[n.startswith("labels:") for n in notes].index(True)]
    assert "9 tags" in names
