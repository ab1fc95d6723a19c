"""data.mapped: a tokenizing map fingerprinted by the tokenizer's identity, not its pickle: the same rows as
datasets' own map, one fingerprint for the same transform, another for every setting that changes the rows."""

from __future__ import annotations

import copy

import datasets
import pytest
from transformers import AutoTokenizer

from leantrain.data.mapped import tokenizer_identity, tokenizer_map
from leantrain.data.text import _encode


@pytest.fixture(scope="module")
def tokenizer(tiny_bert):
    return AutoTokenizer.from_pretrained(tiny_bert)


@pytest.fixture(scope="module")
def rows():
    return datasets.Dataset.from_dict({"text": ["good movie", "bad plot and a long tail of words", "fine"]})


def _map(rows, tok, max_length=16, **extra):
    return tokenizer_map(rows, _encode, {"tokenizer": tok, "max_length": max_length}, batched=True, **extra)


def test_the_rows_are_datasets_own(rows, tokenizer):
    plain = rows.map(_encode, batched=True, fn_kwargs={"tokenizer": tokenizer, "max_length": 6})
    ours = _map(rows, tokenizer, 6)
    assert ours.to_dict() == plain.to_dict() and ours._fingerprint != plain._fingerprint


def test_the_fingerprint_follows_what_changes_the_rows(rows, tokenizer):
    base = _map(rows, tokenizer)._fingerprint
    assert _map(rows, tokenizer)._fingerprint == base  # stable: the cache is found again
    assert _map(rows, copy.deepcopy(tokenizer))._fingerprint == base  # an equal tokenizer: the cache is reused
    assert _map(rows, tokenizer, desc="Tokenizing eval")._fingerprint == base  # the bar's text changes nothing
    assert _map(rows, tokenizer, max_length=8)._fingerprint != base
    assert _map(rows, tokenizer, batch_size=2)._fingerprint != base
    assert _map(rows.select([0, 1]), tokenizer)._fingerprint != base  # other rows
    left = copy.deepcopy(tokenizer)
    left.truncation_side = "left"
    bigger = copy.deepcopy(tokenizer)
    bigger.add_tokens(["plotline"])
    lower = AutoTokenizer.from_pretrained(tokenizer.name_or_path, do_lower_case=False)
    changed = {tokenizer_identity(t) for t in (tokenizer, left, bigger, lower)}
    assert len(changed) == 4 and all(len(_map(rows, t)._fingerprint) for t in (left, bigger, lower))
