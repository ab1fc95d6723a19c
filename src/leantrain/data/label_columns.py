"""Multi-label data as several 0/1 columns, one per label (``data.label_column=[toxic, insult, threat]``).

Each listed column must hold 0 / 1 (ints, floats 0.0 / 1.0, or booleans) in every row of every split; the columns
are replaced by one list column (``LABELS``) of the names of the columns that are 1, which the label-set reader
(``leantrain.data.label_sets``) then reads like JSONL label lists. The label names are the column names, in the
order given (so label ids follow the user's list, not the alphabet)."""

from __future__ import annotations

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from leantrain.config import DataConfig
from leantrain.data.columns import not_found
from leantrain.data.sources import Part, quiet

LABELS = "__leantrain_label_set"  # the merged column; data.label_column reads it once the columns are merged


def label_columns(cfg: DataConfig) -> list[str] | None:
    """The 0/1 label columns when ``data.label_column`` is a list, else None."""
    return list(cfg.label_column) if isinstance(cfg.label_column, list) else None


def _zero_one(values: pa.ChunkedArray) -> np.ndarray:
    """Row indices whose value is not 0 / 1 / false / true (nulls included)."""
    if pa.types.is_boolean(values.type):
        return np.flatnonzero(pc.is_null(values).to_numpy(zero_copy_only=False))
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        return np.arange(len(values))
    ok = pc.fill_null(pc.or_(pc.equal(values, 0), pc.equal(values, 1)), False)
    return np.flatnonzero(~ok.to_numpy(zero_copy_only=False))


def merge_label_columns(cfg: DataConfig, parts: list[Part], *, required: bool = True
                        ) -> tuple[DataConfig, list[str], list[str]]:
    """(the config reading the merged column, notes, problems). Each part's listed columns become one list column
    of label names (in place: ``part.ds`` changes). A part lacking every listed column is left as it is when not
    ``required`` (predict input without labels: the config then reads no label); lacking some is a problem."""
    names = label_columns(cfg)
    problems: list[str] = []
    if not required and all(c not in p.ds.column_names for p in parts for c in names):
        return cfg.model_copy(update={"label_column": None}), [], []  # predict input: no labels
    for part in parts:
        columns = part.ds.column_names
        absent = [c for c in names if c not in columns]
        problems += [not_found(part.where, c, "one of the 0/1 columns of data.label_column", columns)
                     for c in absent]
        table = part.ds.with_format("arrow")
        for c in (c for c in names if c not in absent):
            bad = _zero_one(table[c])
            if bad.size:
                problems.append(f"{part.where}: {len(bad)} row{'s' if len(bad) > 1 else ''} whose value in label "
                                f"column {c!r} is not 0 or 1 ({part.rows(bad)}); data.label_column=[...] lists "
                                "0/1 columns, one per label")
        if problems:
            continue
        hot = np.stack([pc.cast(table[c], pa.int8()).to_numpy(zero_copy_only=False) for c in names], axis=1)
        sets = [[names[j] for j in np.flatnonzero(row)] for row in hot]
        with quiet():
            ds = part.ds.remove_columns(names)
            part.ds = ds.add_column(LABELS, sets, feature=datasets.Sequence(datasets.Value("string")))
    notes = [f"labels: {len(names)} 0/1 columns (data.label_column), one per label: {', '.join(names[:20])}"]
    return cfg.model_copy(update={"label_column": LABELS}), notes, problems
