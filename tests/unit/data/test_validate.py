"""Validation: columns, texts, labels, hold-out, and every problem collected into one DataError."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pandas as pd
import pytest

from leantrain.config import DataConfig
from leantrain.data import PreparedData, load_and_validate
from leantrain.errors import DataError

pytestmark = pytest.mark.usefixtures("own_datasets_cache")  # each test its own Arrow cache, never ~/.cache


def csv_file(folder: Path, name: str, header: str, rows: list[str]) -> str:
    path = folder / name
    path.write_text(header + "\n" + "".join(r + "\n" for r in rows))
    return str(path)


def prepare(batch_size: int = 2, known_labels: list[str] | None = None, **data) -> PreparedData:
    return load_and_validate(DataConfig(**data), seed=0, batch_size=batch_size, known_labels=known_labels)


def problems(**data) -> list[str]:
    with pytest.raises(DataError) as e:
        prepare(**data)
    return e.value.problems


# ----------------------------------------------------------------------------------------------- columns


def test_pairs_win_over_single_texts_and_notes_say_so(tmp_path):
    f = csv_file(tmp_path, "t.csv", "premise,hypothesis,text,class,extra", [f"p{i},h{i},x{i},c{i % 3},1" for i in range(9)])
    data = prepare(train=f)
    assert data.columns == {"text": "premise", "text_pair": "hypothesis", "label": "class"}
    assert data.train.column_names == ["text", "text_pair", "label"]
    assert data.notes[:3] == [
        "text column: 'premise' (auto-detected; set data.text_column to change)",
        "text pair column: 'hypothesis' (auto-detected; set data.text_pair_column to change)",
        "label column: 'class' (auto-detected; set data.label_column to change)"]


def test_explicit_columns_win_and_single_string_fallback(tmp_path):
    f = csv_file(tmp_path, "t.csv", "body,Sentiment,id", [f"words {i},{i % 2},{i}" for i in range(6)])
    data = prepare(train=f, label_column="Sentiment")
    assert data.columns == {"text": "body", "text_pair": None, "label": "Sentiment"}
    assert "text column: 'body' (the only text column; set data.text_column to change)" in data.notes
    assert not any(n.startswith("label column") for n in data.notes)  # not auto-detected
    g = csv_file(tmp_path, "g.csv", "sentence1,sentence2,label", ["a,b,0", "c,d,1"])
    data = prepare(train=g, eval=g, text_column="sentence2")
    assert data.columns["text_pair"] is None and data.train[0]["text"] == "b"
    data = prepare(train=g, eval=g, text_column="sentence1")
    assert "no text pair column: single texts from 'sentence1' (set data.text_pair_column=sentence2 to use pairs)" in data.notes
    data = prepare(train=g, eval=g, text_pair_column="sentence2")
    assert data.columns == {"text": "sentence1", "text_pair": "sentence2", "label": "label"}


def test_missing_column_lists_columns_and_suggests(tmp_path):
    f = csv_file(tmp_path, "train.csv", "sentence,label", ["a,0", "b,1"])
    assert problems(train=f, text_column="sentense") == [
        "data.train: train.csv: no column 'sentense' (set by data.text_column); columns: sentence, label"
        " — did you mean 'sentence'?"]
    g = csv_file(tmp_path, "g.csv", "a,b", ["1,2"])
    found = problems(train=g)
    assert found[0] == "data.train: g.csv: no label column found (columns: a, b); set data.label_column"
    assert found[1] == "data.train: g.csv: no text column found (columns: a, b); set data.text_column"


def test_a_label_column_with_another_name_is_taken_when_it_is_clear_and_said(tmp_path):
    stsb = csv_file(tmp_path, "stsb.csv", "sentence1,sentence2,score", [f"a {i},b {i},{i % 5}" for i in range(6)])
    data = prepare(train=stsb)  # STS-B's own header: a dataset name for the label
    assert data.columns == {"text": "sentence1", "text_pair": "sentence2", "label": "score"}
    assert "label column: 'score' (auto-detected; set data.label_column to change)" in data.notes
    only = csv_file(tmp_path, "only.csv", "review,verdict", [f"words {i},{'yes' if i % 2 else 'no'}" for i in range(6)])
    assert prepare(train=only).columns["label"] == "verdict"
    assert "label column: 'verdict' (the only column besides the text; set data.label_column to change)" in \
        prepare(train=only).notes
    numbers = csv_file(tmp_path, "n.csv", "review,source,votes", [f"words {i},site,{i % 3}" for i in range(6)])
    data = prepare(train=numbers)
    assert data.columns["label"] == "votes" and "label column: 'votes' (the only column of numbers or labels besides " \
        "the text; set data.label_column to change)" in data.notes
    two = csv_file(tmp_path, "two.csv", "review,idx,votes", [f"words {i},{i},{i % 3}" for i in range(6)])
    assert problems(train=two) == ["data.train: two.csv: no label column found (columns: review, idx, votes); "
                                   "set data.label_column"]  # two columns of numbers: which one is not clear


def test_eval_must_have_the_training_columns(tmp_path):
    t = csv_file(tmp_path, "t.csv", "sentence,label", ["a,0", "b,1"])
    e = csv_file(tmp_path, "e.csv", "sentences,labels", ["a,0"])
    assert problems(train=t, eval=e) == [
        "data.eval: e.csv: no column 'sentence' (the text column of the training data); columns: sentences, labels"
        " — did you mean 'sentences'?",
        "data.eval: e.csv: no column 'label' (the label column of the training data); columns: sentences, labels"
        " — did you mean 'labels'?"]


# ----------------------------------------------------------------------------------------------- texts


def test_blank_and_missing_texts_name_file_lines(tmp_path):
    rows = ["good,1", ",0", "  ,1", "fine,0", '"\t",1'] + [f"t{i},0" for i in range(5)] + [",1"] * 5
    f = csv_file(tmp_path, "train.csv", "text,label", rows)
    assert problems(train=f) == [
        "data.train: train.csv: 8 rows with a missing or blank text in column 'text' (lines 3, 4, 6, 12, 13 and 3 more)"]


def test_blank_texts_in_jsonl_pairs_and_parquet_rows(tmp_path):
    recs = [{"question": "q", "sentence": "s", "label": 0}, {"question": "q", "sentence": " ", "label": 1}]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n" + json.dumps({"question": None, "sentence": "s", "label": 1}) + "\n")
    assert problems(train=str(path)) == [
        "data.train: p.jsonl: 1 row with a missing or blank text in column 'question' (line 4)",
        "data.train: p.jsonl: 1 row with a missing or blank second text (text pair) in column 'sentence' (line 2)"]
    pd.DataFrame({"text": ["a", "", "c"], "label": [0, 1, 0]}).to_parquet(tmp_path / "x.parquet")
    assert problems(train=str(tmp_path / "x.parquet")) == [
        "data.train: x.parquet: 1 row with a missing or blank text in column 'text' (row 2)"]


def test_numbers_in_a_text_column_are_a_warning(tmp_path):
    f = csv_file(tmp_path, "t.csv", "text,label", [f"{i},{i % 2}" for i in range(10)])
    data = prepare(train=f)
    assert data.train.features["text"] == datasets.Value("string") and data.train[0]["text"] in {str(i) for i in range(10)}
    assert data.warnings == ["data.train: t.csv: text column 'text' holds int64 values, not strings; they are used as text"]


# ----------------------------------------------------------------------------------------------- labels


def test_integer_labels_0_to_k_keep_ids_and_take_names(tmp_path):
    f = csv_file(tmp_path, "t.csv", "text,label", ["a,2", "b,0", "c,1", "d,2"])
    data = prepare(train=f, eval=f, label_names=["neg", "neu", "pos"])
    assert data.label_names == ["neg", "neu", "pos"] and data.train["label"] == [2, 0, 1, 2]
    assert prepare(train=f, eval=f).label_names == ["0", "1", "2"]
    assert problems(train=f, eval=f, label_names=["neg", "pos"]) == [
        "data.label_names: 2 names, but the labels include 2: integer labels must be the ids 0..1"]


def test_stars_strings_bools_and_whole_floats_are_names(tmp_path):
    stars = csv_file(tmp_path, "s.csv", "text,label", ["a,5", "b,3", "c,1", "d,3", "e,10"])
    data = prepare(train=stars, eval=stars)
    assert data.label_names == ["1", "3", "5", "10"] and data.train["label"] == [2, 1, 0, 1, 3]
    words = csv_file(tmp_path, "w.csv", "text,label", ["a,pos", "b,neg", "c,neutral", "d,pos"])
    assert prepare(train=words, eval=words).label_names == ["neg", "neutral", "pos"]
    data = prepare(train=words, eval=words, label_order="first_seen")
    assert data.label_names == ["pos", "neg", "neutral"] and data.train["label"] == [0, 1, 2, 0]
    assert "labels: 3 classes in column 'label', ids in order of first appearance" in data.notes[-1]
    flags = tmp_path / "b.jsonl"
    flags.write_text('{"text": "a", "label": true}\n{"text": "b", "label": false}\n')
    assert prepare(train=str(flags), eval=str(flags)).label_names == ["False", "True"]
    floats = csv_file(tmp_path, "f.csv", "text,label", ["a,1.0", "b,0.0", "c,1.0"])
    data = prepare(train=floats, eval=floats)
    assert data.label_names == ["0", "1"] and data.train["label"] == [1, 0, 1]


def test_fractional_labels_are_refused_naming_regression(tmp_path):
    f = csv_file(tmp_path, "t.csv", "text,label", ["a,1.0", "b,0.5", "c,0.25"])
    (problem,) = problems(train=f)
    assert problem.startswith("data.train: t.csv: label column 'label' holds numbers that are not whole (0.5 at lines 3, 4)")
    assert "model.task=text-regression" in problem


def test_eval_label_missing_from_train_and_null_labels(tmp_path):
    t = csv_file(tmp_path, "train.csv", "text,label", ["a,pos", "b,neg", "c,", "d,pos"])
    e = csv_file(tmp_path, "dev.csv", "text,label", ["a,pos", "b,neutral", "c,neutral", "d,meh"])
    assert problems(train=t, eval=e) == [
        "data.train: train.csv: 1 row with no label in column 'label' (line 4)",
        "data.eval: dev.csv: label 'neutral' never occurs in the training data, so it is outside the model's label "
        "set (pos, neg) — 2 rows (lines 3, 4)",
        "data.eval: dev.csv: label 'meh' never occurs in the training data, so it is outside the model's label set "
        "(pos, neg) — 1 row (line 5)"]


def test_known_labels_map_by_name_or_by_id(tmp_path):
    words = csv_file(tmp_path, "w.csv", "text,label", ["a,positive", "b,negative"])
    data = prepare(train=words, eval=words, known_labels=["positive", "negative"])
    assert data.label_names == ["positive", "negative"] and data.train["label"] == [0, 1]
    ints = csv_file(tmp_path, "i.csv", "text,label", ["a,1", "b,0"])
    assert prepare(train=ints, eval=ints, known_labels=["negative", "positive"]).train["label"] == [1, 0]
    stars = csv_file(tmp_path, "s.csv", "text,label", ["a,5", "b,1"])
    assert prepare(train=stars, eval=stars, known_labels=["1", "2", "3", "4", "5"]).train["label"] == [4, 0]
    other = csv_file(tmp_path, "o.csv", "text,label", ["a,positive", "b,angry"])
    assert problems(train=words, eval=other, known_labels=["positive", "negative"]) == [
        "data.eval: o.csv: label 'angry' is outside the model's label set (positive, negative) — 1 row (line 3)"]


def test_string_labels_follow_label_names_order(tmp_path):
    f = csv_file(tmp_path, "t.csv", "text,label", ["a,pos", "b,neg"])
    assert prepare(train=f, eval=f, label_names=["pos", "neg"]).train["label"] == [0, 1]
    assert problems(train=f, eval=f, label_names=["positive", "neg"]) == [
        "data.label_names does not list the label 'pos' found in the training data"]


# ----------------------------------------------------------------------------------------------- one pass


def test_every_problem_is_reported_at_once(tmp_path):
    t = csv_file(tmp_path, "train.csv", "text,label", ["a,pos", ",neg", "c,"])
    e = csv_file(tmp_path, "dev.csv", "text,label", ["x,pos", " ,other"])
    found = problems(train=t, eval=e)
    assert len(found) == 4
    assert found[0].startswith("data.train: train.csv: 1 row with a missing or blank text") and "(line 3)" in found[0]
    assert found[1].startswith("data.eval: dev.csv: 1 row with a missing or blank text") and "(line 3)" in found[1]
    assert found[2] == "data.train: train.csv: 1 row with no label in column 'label' (line 4)"
    assert found[3].startswith("data.eval: dev.csv: label 'other' never occurs in the training data")


# ----------------------------------------------------------------------------------------------- shaping


def test_hold_out_is_seeded_and_samples_take_the_first_rows(tmp_path):
    f = csv_file(tmp_path, "t.csv", "text,label", [f"text {i},{i % 2}" for i in range(50)])
    a, b = prepare(train=f, eval_fraction=0.2), prepare(train=f, eval_fraction=0.2)
    assert (len(a.train), len(a.eval)) == (40, 10) and a.eval["text"] == b.eval["text"]
    assert set(a.train["text"]).isdisjoint(a.eval["text"])
    assert "eval data: none given, so 10 of 50 training rows (20%) are held out (seed 0" in a.notes[-1]
    other = load_and_validate(DataConfig(train=f, eval_fraction=0.2), seed=1, batch_size=2)
    assert other.eval["text"] != a.eval["text"]
    small = prepare(train=f, max_train_samples=5, max_eval_samples=3)
    assert (len(small.train), len(small.eval)) == (5, 3)
    assert "data.max_train_samples: using the first 5 of 45 training rows" in small.notes


def test_fewer_rows_than_a_batch_is_a_warning_not_an_error(tmp_path):
    f = csv_file(tmp_path, "t.csv", "text,label", ["a,0", "b,1", "c,0"])
    data = prepare(train=f, eval=f, batch_size=32)
    assert data.warnings == ["only 3 training examples, fewer than one batch (train.batch_size=32)"]
    (problem,) = problems(train=csv_file(tmp_path, "one.csv", "text,label", ["a,0"]))
    assert problem.startswith("data.eval_fraction=0.1: cannot hold out eval rows from 1 training rows")
    assert problem.endswith("; set data.eval")


def test_label_mapping_is_cached_by_fingerprint(tmp_path):
    f = csv_file(tmp_path, "t.csv", "text,label", [f"t{i},{'ab'[i % 2]}" for i in range(30)])
    a, b = prepare(train=f, eval=f), prepare(train=f, eval=f)
    assert a.train._fingerprint == b.train._fingerprint and a.train.cache_files == b.train.cache_files
