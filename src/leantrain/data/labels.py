"""Labels -> ids.

Integer labels whose union over train + eval is exactly 0..K-1 are already the ids. Anything else (strings,
stars 1..5, true/false) is a name, mapped to an id in sorted or first-seen order, or in the order of
data.label_names. A fine-tuned model's own label set (``known``) wins over all of that. Scans use Arrow compute,
so a 67k-row file costs milliseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from leantrain.config import DataConfig
from leantrain.data.sources import Part, SourceError


@dataclass
class LabelScan:
    names: pa.ChunkedArray  # each row's label as a string (null where missing)
    ints: pa.ChunkedArray | None  # each row's label as int64, when every label is an integer
    class_names: list[str] | None = None  # from a ClassLabel feature


@dataclass
class LabelMap:
    names: list[str]  # id -> name
    ids: dict[str, int] | None  # name -> id; None when the integer labels are the ids

    def apply(self, ds: datasets.Dataset, col: str = "label") -> datasets.Dataset:
        """``col`` as int64 ids: a cast when the labels are the ids, else a cached batched map."""
        feature = ds.features[col]
        numeric = isinstance(feature, datasets.ClassLabel) or (
            isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint", "float")))
        if self.ids is None and numeric:
            return ds if feature == datasets.Value("int64") else ds.cast_column(col, datasets.Value("int64"))
        lut = self.ids if self.ids is not None else {str(i): i for i in range(len(self.names))}
        features = ds.features.copy()
        features[col] = datasets.Value("int64")
        return ds.map(_ToIds(lut, col), batched=True, features=features)


class _ToIds:
    """A picklable mapping function, so that ``Dataset.map`` can fingerprint and cache it."""

    def __init__(self, lut: dict[str, int], col: str):
        self.lut, self.col = lut, col

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[int]]:
        return {self.col: [self.lut[label_name(v)] for v in batch[self.col]]}


def label_name(value: Any) -> str:
    """The name of a label value: 3 -> "3", 3.0 -> "3", True -> "True", "pos" -> "pos"."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def nonzero(mask: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))


def uniques(values: pa.ChunkedArray) -> list[Any]:
    """Distinct non-null values in order of first appearance."""
    return [v for v in pc.unique(values).to_pylist() if v is not None]


# ----------------------------------------------------------------------------------------------- scanning


def scan(part: Part, col: str) -> LabelScan:
    """The labels of ``part`` as names (and ints); SourceError for floats that are not whole, lists, ..."""
    feature = part.ds.features[col]
    arr = part.ds.with_format("arrow")[col]
    kind = arr.type
    if isinstance(feature, datasets.ClassLabel):  # -1 marks an unlabelled row
        ints = pc.if_else(pc.less(arr, 0), pa.scalar(None, pa.int64()), arr.cast(pa.int64()))
        return LabelScan(ints.cast(pa.string()), ints, list(feature.names))
    if pa.types.is_integer(kind):
        ints = arr.cast(pa.int64())
    elif pa.types.is_floating(kind):
        _refuse_fractions(part, col, arr)
        ints = arr.cast(pa.int64())
    elif pa.types.is_boolean(kind):
        return LabelScan(pc.if_else(arr, pa.scalar("True"), pa.scalar("False")), None)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return LabelScan(arr.cast(pa.string()), None)
    elif isinstance(feature, datasets.Json):
        return _scan_python(part, col, [None if v is None else json.loads(v) for v in arr.to_pylist()])
    else:
        raise SourceError(f"{part.where}: label column {col!r} holds {feature}; labels must be integers or strings")
    return LabelScan(ints.cast(pa.string()), ints)


def _refuse_fractions(part: Part, col: str, arr: pa.ChunkedArray) -> None:
    idx = nonzero(pc.not_equal(arr, pc.floor(arr)))
    if idx.size:
        raise SourceError(
            f"{part.where}: label column {col!r} holds numbers that are not whole ({arr[int(idx[0])].as_py()!r} at "
            f"{part.rows(idx)}); class labels must be integers or strings; for scores (regression) set "
            "model.task=text-regression")


def _scan_python(part: Part, col: str, values: list[Any]) -> LabelScan:
    """Mixed JSON labels (e.g. 1 and "pos" in one file)."""
    bad = [i for i, v in enumerate(values) if isinstance(v, (list, dict)) or (isinstance(v, float) and not v.is_integer())]
    if bad:
        raise SourceError(f"{part.where}: label column {col!r} holds {values[bad[0]]!r} at {part.rows(bad)}; "
                          "labels must be integers or strings (for scores, regression: model.task=text-regression)")
    names = pa.chunked_array([pa.array([None if v is None else label_name(v) for v in values], pa.string())])
    whole = all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values)
    return LabelScan(names, pc.cast(names, pa.int64()) if whole else None)


# ----------------------------------------------------------------------------------------------- problems


def missing(part: Part, labels: LabelScan, col: str) -> list[str]:
    idx = nonzero(pc.is_null(labels.names))
    if not idx.size:
        return []
    unlabelled = " (-1: an unlabelled split?)" if labels.class_names is not None else ""
    return [f"{part.where}: {len(idx)} row{'s' if len(idx) > 1 else ''} with no label in column {col!r}{unlabelled} "
            f"({part.rows(idx)})"]


def outside(part: Part, labels: LabelScan, allowed: list[str], reason: str) -> list[str]:
    """One problem per label of ``part`` that is not in ``allowed``, with its count and first rows."""
    allowed_arr = pa.array(allowed, pa.string())
    idx = nonzero(pc.and_(pc.invert(pc.is_in(labels.names, value_set=allowed_arr)), pc.is_valid(labels.names)))
    if not idx.size:
        return []
    rows: dict[str, list[int]] = {}
    for i, name in zip(idx.tolist(), labels.names.take(pa.array(idx)).to_pylist()):
        rows.setdefault(name, []).append(i)
    problems = [f"{part.where}: label {name!r} {reason} — {len(r)} row{'s' if len(r) > 1 else ''} ({part.rows(r)})"
                for name, r in list(rows.items())[:5]]
    if len(rows) > 5:
        problems.append(f"{part.where}: {len(rows) - 5} more labels like these ({capped(list(rows)[5:])})")
    return problems


def capped(names: list[Any], limit: int = 10) -> str:
    """The first ``limit`` names and how many there are: long label sets must not make kilobyte-long errors."""
    shown = ", ".join(map(str, names[:limit]))
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


SEPARATORS = (",", ";", "|")


def set_like(names: list[str]) -> str | None:
    """A warning when string labels look like sets joined by a separator ("anger,disgust"): several labels hold the
    separator and their parts recur across labels, so each combination would become a class of its own."""
    from collections import Counter

    for sep in SEPARATORS:
        joined = [n for n in names if sep in n]
        if len(joined) < 2:
            continue
        parts = Counter(p for n in joined for p in {x.strip() for x in n.split(sep)} if p)
        recurring = [p for p, c in parts.items() if c >= 2]
        if len(recurring) >= 2:
            singles = {n.strip() for n in names if sep not in n}
            distinct = set(parts) | singles
            return (f"{len(joined)} of the {len(names)} labels hold {sep!r} and look like sets of "
                    f"{len(distinct)} labels ({capped([repr(n) for n in joined], 3)}): each combination becomes a "
                    "class of its own. If a row can have several labels, that is multi-label classification: set "
                    f"model.task=multi-label data.label_separator={sep}")
    return None


def listing(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(f"{i} = {n}" for i, n in enumerate(names[:limit]))
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


# ----------------------------------------------------------------------------------------------- mapping


def from_known(known: list[str], parts: list[tuple[Part, LabelScan]]) -> tuple[LabelMap, list[str], list[str]]:
    """(map, notes, problems) for a model that already has its labels (``known``, in id order)."""
    index = {name: i for i, name in enumerate(known)}
    found = {name for _, labels in parts for name in uniques(labels.names)}
    if found <= index.keys():
        ids = None if known == [str(i) for i in range(len(known))] else index
        return LabelMap(list(known), ids), [f"labels: the model's {len(known)} labels: {listing(known)}"], []
    ints = [v for _, labels in parts if labels.ints is not None for v in uniques(labels.ints)]
    if all(labels.ints is not None for _, labels in parts) and all(0 <= v < len(known) for v in ints):
        note = f"labels: the integer labels are the model's label ids ({listing(known)})"
        return LabelMap(list(known), None), [note], []
    reason = f"is outside the model's label set ({capped(known)})"
    return LabelMap(list(known), index), [], [p for part, labels in parts for p in outside(part, labels, known, reason)]


def from_data(cfg: DataConfig, col: str, train: tuple[Part, LabelScan], evals: list[tuple[Part, LabelScan]]
              ) -> tuple[LabelMap | None, list[str], list[str], list[str]]:
    """(map, notes, warnings, problems) for labels taken from the data; eval labels must occur in train."""
    train_labels = train[1]
    seen = uniques(train_labels.names)
    reason = f"never occurs in the training data, so it is outside the model's label set ({capped(seen)})"
    problems = [p for part, labels in evals for p in outside(part, labels, seen, reason)]
    label_map, note, warnings, decided = None, "", [], False
    if train_labels.class_names is not None and cfg.label_names is None:
        names = train_labels.class_names
        label_map, note = LabelMap(names, None), f"labels: the dataset's {len(names)} classes: {listing(names)}"
    elif train_labels.ints is not None and all(labels.ints is not None for _, labels in evals):
        values = sorted({v for labels in [train_labels] + [e[1] for e in evals] for v in uniques(labels.ints)})
        if cfg.label_names is not None:
            label_map, note, warnings, more = _named_ids(cfg.label_names, values)
            problems, decided = problems + more, True
        elif values == list(range(len(values))):
            names = [str(v) for v in values]
            label_map, note = LabelMap(names, None), f"labels: {len(names)} classes, the integer labels are the ids"
    if label_map is None and not decided:
        label_map, note, more = _by_name(cfg, col, seen, numeric=train_labels.ints is not None)
        problems += more
        if train_labels.ints is None and (sets := set_like([str(n) for n in seen])):
            warnings.append(f"column {col!r}: {sets}")
        warnings += _mixed(train[0], col, seen) if train_labels.ints is None else []
    if problems:
        return None, [], warnings, problems
    return label_map, [note], warnings, []


def _mixed(part: Part, col: str, seen: list[str]) -> list[str]:
    """A warning when labels mix integers and other strings ("0", "1", "pos" become 3 classes)."""
    import re

    ints = [n for n in seen if re.fullmatch(r"[-+]?\d+", n.strip())]
    others = [n for n in seen if n not in ints]
    if not ints or not others:
        return []
    return [f"{part.where}: label column {col!r} mixes integers ({', '.join(map(repr, ints[:5]))}) and other names "
            f"({', '.join(map(repr, others[:5]))}): each is a class of its own ({len(seen)} classes); if they mean "
            "the same classes, write them one way"]


def _named_ids(names: list[str], values: list[int]) -> tuple[LabelMap | None, str, list[str], list[str]]:
    bad = [v for v in values if not 0 <= v < len(names)]
    if bad:
        return None, "", [], [f"data.label_names: {len(names)} names, but the labels include "
                              f"{capped(bad)}: integer labels must be the ids 0..{len(names) - 1}"]
    absent = [f"{names[i]!r} (id {i})" for i in range(len(names)) if i not in values]
    warnings = [f"data.label_names: never in the data: {', '.join(absent)}"] if absent else []
    return LabelMap(list(names), None), f"labels: the integer labels are the ids of data.label_names: {listing(names)}", warnings, []


def _by_name(cfg: DataConfig, col: str, seen: list[str], *, numeric: bool) -> tuple[LabelMap | None, str, list[str]]:
    if cfg.label_names is not None:
        unnamed = [n for n in seen if n not in cfg.label_names]
        if unnamed:
            return None, "", [f"data.label_names does not list the label{'s' if len(unnamed) > 1 else ''} "
                              f"{capped([repr(n) for n in unnamed])} found in the training data"]
        names, how = list(cfg.label_names), "in the order of data.label_names"
    elif cfg.label_order == "sorted":
        names = sorted(seen, key=int) if numeric else sorted(seen)
        how = "ids in sorted order (set data.label_order=first_seen to change)"
    else:
        names, how = list(seen), "ids in order of first appearance (set data.label_order=sorted to change)"
    note = f"labels: {len(names)} classes in column {col!r}, {how}: {listing(names)}"
    return LabelMap(names, {n: i for i, n in enumerate(names)}), note, []
