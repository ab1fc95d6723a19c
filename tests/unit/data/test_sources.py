"""Sources: every file type, saved folders, dataset folders, and clear errors for broken files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets
import pandas as pd
import pytest

from leantrain.config import DataConfig
from leantrain.data import PreparedData, load_and_validate, load_rows
from leantrain.errors import DataError

pytestmark = pytest.mark.usefixtures("own_datasets_cache")  # each test its own Arrow cache, never ~/.cache


def write(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


def prepare(**data) -> PreparedData:
    return load_and_validate(DataConfig(**data), seed=0, batch_size=2)


def problems_of(excinfo) -> list[str]:
    return excinfo.value.problems


CSV = "text,label\n" + "".join(f"row number {i},{'pos' if i % 2 else 'neg'}\n" for i in range(20))
ROWS = [{"text": f"row number {i}", "label": "pos" if i % 2 else "neg"} for i in range(20)]


# ----------------------------------------------------------------------------------------------- formats


@pytest.mark.parametrize("name, text", [
    ("a.csv", CSV),
    ("a.tsv", CSV.replace(",", "\t")),
    ("a.tab", CSV.replace(",", "\t")),
    ("a.jsonl", "".join(json.dumps(r) + "\n" for r in ROWS)),
    ("a.ndjson", "".join(json.dumps(r) + "\n" for r in ROWS)),
    ("lines.json", "".join(json.dumps(r) + "\n" for r in ROWS)),
    ("list.json", json.dumps(ROWS, indent=1)),
])
def test_text_formats_load_to_canonical_columns(tmp_path, name, text):
    data = prepare(train=write(tmp_path, name, text), eval=write(tmp_path, "dev" + Path(name).suffix, text))
    assert data.train.column_names == ["text", "label"]
    assert len(data.train) == 20 and len(data.eval) == 20
    assert data.label_names == ["neg", "pos"]
    assert data.train[:3] == {"text": ["row number 0", "row number 1", "row number 2"], "label": [0, 1, 0]}
    assert data.columns == {"text": "text", "text_pair": None, "label": "label"}


def test_parquet_and_pq(tmp_path):
    pd.DataFrame(ROWS).to_parquet(tmp_path / "t.parquet")
    pd.DataFrame(ROWS[:6]).to_parquet(tmp_path / "e.pq")
    data = prepare(train=str(tmp_path / "t.parquet"), eval=str(tmp_path / "e.pq"))
    assert (len(data.train), len(data.eval)) == (20, 6)
    assert data.eval["label"] == [0, 1, 0, 1, 0, 1]


def test_save_to_disk_dataset_dict_uses_class_names_and_validation_split(tmp_path):
    ds = datasets.Dataset.from_dict({"sentence": ["good", "bad", "fine", "awful"], "label": [1, 0, 1, 0]})
    ds = ds.cast_column("label", datasets.ClassLabel(names=["negative", "positive"]))
    datasets.DatasetDict({"train": ds, "validation": ds.select([0, 1]), "test": ds}).save_to_disk(tmp_path / "saved")
    data = prepare(train=str(tmp_path / "saved"))
    assert data.label_names == ["negative", "positive"]
    assert (len(data.train), len(data.eval)) == (4, 2)
    assert data.train["label"] == [1, 0, 1, 0] and data.train.features["label"] == datasets.Value("int64")
    assert any("split 'validation' of saved" in n for n in data.notes)


def test_save_to_disk_single_dataset_holds_out(tmp_path):
    datasets.Dataset.from_list(ROWS).save_to_disk(tmp_path / "one")
    data = prepare(train=str(tmp_path / "one"))
    assert (len(data.train), len(data.eval)) == (18, 2)


def test_dataset_folder_goes_through_load_dataset(tmp_path):
    folder = tmp_path / "hubish"
    folder.mkdir()
    write(folder, "train.csv", CSV)
    write(folder, "test.csv", "text,label\nlast one,pos\n")
    data = prepare(train=str(folder))
    assert (len(data.train), len(data.eval)) == (20, 1)
    assert any("split 'test'" in n for n in data.notes)


def test_other_names_go_to_load_dataset_for_real(tmp_path, monkeypatch):
    """A name that is no local path goes to datasets.load_dataset, the real Hub path (offline here: it fails
    fast with HF_HUB_OFFLINE=1, and the failure is reported with the key and the name)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError) as e:
        prepare(train="owner/sentiment", eval="./local/dev.csv")
    assert problems_of(e)[0].startswith("data.train: 'owner/sentiment' is not a local file or folder, and it is "
                                        "not in the datasets cache")
    assert problems_of(e)[1].startswith("data.eval: file not found: ")  # a path, never a Hub name


def test_missing_split_lists_the_splits(tmp_path):
    datasets.DatasetDict({"fit": datasets.Dataset.from_list(ROWS)}).save_to_disk(tmp_path / "saved")
    with pytest.raises(DataError) as e:
        prepare(train=str(tmp_path / "saved"))
    assert "data.train_split: no split 'train'" in str(e.value) and "(splits: fit)" in str(e.value)
    assert len(prepare(train=str(tmp_path / "saved"), train_split="fit").train) == 18


def test_na_like_strings_are_ordinary_texts_and_labels(tmp_path):
    data = prepare(train=write(tmp_path, "t.csv", "text,label\nNA,None\nnull,n/a\nNaN,None\nok,n/a\n"),
                   eval=write(tmp_path, "e.csv", "text,label\nnan,None\n"))
    assert data.train["text"] == ["NA", "null", "NaN", "ok"]
    assert data.label_names == ["None", "n/a"]


# ----------------------------------------------------------------------------------------------- errors


def test_missing_files_name_the_key_and_path_together(tmp_path):
    with pytest.raises(DataError) as e:
        prepare(train=str(tmp_path / "nope.csv"), eval=str(tmp_path / "gone.jsonl"))
    assert problems_of(e) == [f"data.train: file not found: {tmp_path / 'nope.csv'}",
                              f"data.eval: file not found: {tmp_path / 'gone.jsonl'}"]


def test_unsupported_extension(tmp_path):
    with pytest.raises(DataError, match=r"data.train: notes.txt: unsupported file type '.txt'"):
        prepare(train=write(tmp_path, "notes.txt", "hello\n"))


def test_csv_extra_field_names_the_line(tmp_path):
    text = "text,label\n" + "".join(f"t{i},1\n" for i in range(5)) + "hello, world,0\n" + "t,0\nx,1,2\n"
    with pytest.raises(DataError) as e:
        prepare(train=write(tmp_path, "train.csv", text))
    (problem,) = problems_of(e)
    assert problem.startswith("data.train: train.csv line 7: expected 2 fields, found 3")
    assert "must be quoted" in problem and "1 more malformed line (9)" in problem


def test_tsv_too_few_fields_and_open_quote(tmp_path):
    with pytest.raises(DataError, match=r"data.eval: dev.tsv line 3: expected 2 fields, found 1"):
        prepare(train=write(tmp_path, "t.tsv", "text\tlabel\na\t1\n"), eval=write(tmp_path, "dev.tsv", "text\tlabel\na\t1\nb\n"))
    with pytest.raises(DataError, match=r"t.csv line 3: expected 2 fields, found 1 \(the row runs on to line 5"):
        prepare(train=write(tmp_path, "t.csv", 'text,label\na,1\n"b,0\nc,1\nd,0\n'))


def test_empty_and_header_only_files(tmp_path):
    with pytest.raises(DataError) as e:
        prepare(train=write(tmp_path, "t.csv", ""), eval=write(tmp_path, "e.tsv", "text\tlabel\n\n"))
    assert problems_of(e) == ["data.train: t.csv is empty (no header line)",
                              "data.eval: e.tsv has no rows (only a header line)"]


def test_invalid_json_lines_names_the_line(tmp_path):
    lines = [json.dumps(r) for r in ROWS[:3]] + ['{"text": "broken" "label": "pos"}'] + [json.dumps(ROWS[4])]
    with pytest.raises(DataError) as e:
        prepare(train=write(tmp_path, "rows.jsonl", "\n".join(lines) + "\n"))
    assert problems_of(e) == ["data.train: rows.jsonl line 4: invalid JSON (Expecting ',' delimiter)"]


def test_invalid_json_list_and_non_objects(tmp_path):
    with pytest.raises(DataError, match=r"data.train: bad.json line 3: invalid JSON"):
        prepare(train=write(tmp_path, "bad.json", '[\n{"text": "a", "label": 1},\n{"text": "b" "label": 0}\n]'))
    with pytest.raises(DataError, match=r"data.train: arr.jsonl line 2: expected a JSON object"):
        prepare(train=write(tmp_path, "arr.jsonl", '{"text": "a", "label": 1}\n[1, 2]\n'))


def test_not_utf8(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("text,label\ncafe,1\ncaf\xe9,0\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin.csv line 3: not valid UTF-8"):
        prepare(train=str(path))


def test_broken_parquet(tmp_path):
    with pytest.raises(DataError, match=r"data.train: x.parquet: not a readable Parquet file \(ArrowInvalid"):
        prepare(train=write(tmp_path, "x.parquet", "not parquet at all"))
    pd.DataFrame({"text": pd.Series([], dtype=str), "label": pd.Series([], dtype=int)}).to_parquet(tmp_path / "e.pq")
    with pytest.raises(DataError, match=r"data.train: e.pq has no rows"):
        prepare(train=str(tmp_path / "e.pq"))
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DataError, match=r"data.train: folder .*nothing is empty"):
        prepare(train=str(tmp_path / "nothing"))


# ----------------------------------------------------------------------------------------------- demo, predict


def test_demo_when_train_is_unset(tmp_path, monkeypatch):
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    data = prepare()
    assert (len(data.train), len(data.eval)) == (1500, 300)
    assert data.label_names == ["negative", "neutral", "positive"]
    assert any("built-in demo" in n for n in data.notes)


def test_load_rows_for_predict_and_eval(tmp_path):
    unlabelled = write(tmp_path, "in.jsonl", '{"review": "great"}\n{"review": "poor"}\n')
    rows, notes = load_rows(unlabelled, DataConfig(), require_labels=False, known_labels=["neg", "pos"])
    assert rows.column_names == ["text"] and rows["text"] == ["great", "poor"]
    assert notes == ["text column: 'review' (auto-detected; set data.text_column to change)"]
    with pytest.raises(DataError, match=r"in.jsonl: no label column found \(columns: review\)"):
        load_rows(unlabelled, DataConfig(), require_labels=True, known_labels=["neg", "pos"])
    labelled = write(tmp_path, "l.csv", "text,label\na,pos\nb,neutral\n")
    with pytest.raises(DataError, match=r"l.csv: label 'neutral' is outside the model's label set \(neg, pos\)"
                                        r" — 1 row \(line 3\)"):
        load_rows(labelled, DataConfig(), require_labels=True, known_labels=["neg", "pos"])
    rows, notes = load_rows(labelled, DataConfig(), require_labels=False, known_labels=["neg", "pos"])
    assert rows.column_names == ["text"] and any("left out" in n for n in notes)


@pytest.mark.parametrize("name", ["pairs.jsonl", "pairs.csv"])
def test_a_file_rewritten_with_the_same_size_and_time_is_read_again(tmp_path, name):
    """datasets keys its Arrow copy of a file by its modification time: the rows (and every map over them) must follow
    the content instead (issue 35, probe 2: chosen / rejected swapped in place, the time set back)."""
    from leantrain.data.sources import open_source

    rows = [{"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad! {i}"} for i in range(4)]
    swapped = [dict(r) for r in rows]
    swapped[2]["chosen"], swapped[2]["rejected"] = rows[2]["rejected"], rows[2]["chosen"]
    as_text = (lambda rs: "".join(json.dumps(r) + "\n" for r in rs)) if name.endswith(".jsonl") else \
        (lambda rs: "prompt,chosen,rejected\n" + "".join(f"{r['prompt']},{r['chosen']},{r['rejected']}\n" for r in rs))
    path = tmp_path / name
    path.write_text(as_text(rows))
    first = open_source(str(path), "data.train").data
    assert first.map(lambda r: {"pair": r["chosen"] + "|" + r["rejected"]})[2]["pair"] == "good 2|bad! 2"
    st = path.stat()
    path.write_text(as_text(swapped))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    again = open_source(str(path), "data.train").data
    assert again[2]["chosen"] == "bad! 2"
    assert again.map(lambda r: {"pair": r["chosen"] + "|" + r["rejected"]})[2]["pair"] == "bad! 2|good 2"
    path.write_text(as_text(rows))  # the first content again: its cache, the same rows
    assert open_source(str(path), "data.train").data[2]["chosen"] == "good 2"
