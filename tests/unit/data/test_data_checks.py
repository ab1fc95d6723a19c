"""Bad data that used to get through (issue 17, items 9, 10, 15): a stray quote merging TSV rows, single-class
training data, a column name given twice, labels mixing integers and names."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from leantrain.config import DataConfig
from leantrain.data import load_and_validate
from leantrain.errors import DataError


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_cache")))


def write(folder: Path, name: str, lines: list[str]) -> str:
    path = folder / name
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def prepare(**data):
    return load_and_validate(DataConfig(**data), seed=0, batch_size=2)


def problems(**data) -> list[str]:
    with pytest.raises(DataError) as e:
        prepare(**data)
    return e.value.problems


def _tsv_with_a_stray_quote(tmp_path: Path) -> str:
    rows = [f"review number {i} is {'good' if i % 2 else 'bad'}\t{i % 2}" for i in range(100)]
    rows[41] = '"a stray quote opens this text\t1'  # line 43 of the file (header on line 1) ...
    rows[42] = 'and a quote closes" it\t0'  # ... and merges it with line 44: 99 rows, a text holding "\t1\n"
    return write(tmp_path, "t.tsv", ["sentence\tlabel", *rows])


def test_stray_quote_in_tsv_is_refused_with_its_lines_not_merged(tmp_path):
    f = _tsv_with_a_stray_quote(tmp_path)
    (problem,) = problems(train=f)
    assert "data.train: t.tsv line 43" in problem and "runs on to line 44" in problem and "stray quote" in problem
    assert "data.quoting=none" in problem


def test_quoting_none_reads_every_row_with_the_quote_as_text(tmp_path):
    f = _tsv_with_a_stray_quote(tmp_path)
    data = prepare(train=f, eval=f, quoting="none")
    assert len(data.train) == 100 and data.train[41]["text"] == '"a stray quote opens this text'
    assert data.train[42]["text"] == 'and a quote closes" it'


def test_well_formed_quoted_tsv_is_still_unquoted(tmp_path):
    """GLUE's MRPC / STS-B TSVs quote fields CSV-style: those stay read as meant."""
    f = write(tmp_path, "q.tsv", ["sentence\tlabel", '"He said ""hi"" twice"\t1', "plain text\t0"])
    data = prepare(train=f, eval=f)
    assert data.train["text"] == ['He said "hi" twice', "plain text"]


def test_rows_over_several_lines_are_reported_with_their_lines(tmp_path):
    f = write(tmp_path, "m.csv", ["text,label", '"first line', 'second line",1', "plain,0", "more,1"])
    data = prepare(train=f, eval=f)
    (warning,) = [w for w in data.warnings if "several lines" in w and w.startswith("data.train")]
    assert "lines 2-3" in warning and "3 rows from 5 lines" in warning


def test_quoted_field_with_delimiter_and_newline_is_accepted_when_asked(tmp_path):
    f = write(tmp_path, "m.csv", ["text,label", '"one, two', 'three",1', "plain,0"])
    assert "stray quote" in problems(train=f)[0]
    data = prepare(train=f, eval=f, quoting="standard")
    assert data.train["text"][0] == "one, two\nthree"


def test_single_class_training_data_names_column_and_class(tmp_path):
    f = write(tmp_path, "one.csv", ["text,stars", *[f"review {i},five" for i in range(20)]])
    (problem,) = problems(train=f, label_column="stars")
    assert "'five'" in problem and "'stars'" in problem and "at least 2 classes" in problem


def test_column_name_twice_is_a_warning(tmp_path):
    f = write(tmp_path, "d.csv", ["text,label,text", *[f"a{i},{i % 2},b{i}" for i in range(6)]])
    data = prepare(train=f)
    (warning,) = [w for w in data.warnings if "appears 2 times" in w and w.startswith("data.train")]
    assert "column 'text'" in warning and "fields 1, 3" in warning


def test_labels_mixing_integers_and_names_is_a_warning(tmp_path):
    f = write(tmp_path, "m.csv", ["text,label", *[f"t{i},{['0', '1', 'pos'][i % 3]}" for i in range(9)]])
    data = prepare(train=f)
    (warning,) = [w for w in data.warnings if "mixes integers" in w and w.startswith("data.train")]
    assert "'0', '1'" in warning and "'pos'" in warning and "3 classes" in warning
