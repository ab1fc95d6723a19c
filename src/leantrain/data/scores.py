"""Score labels (regression): one number per row, read as float32 and checked (present, a number, finite). The
label reader a task picks by name (``labels="scores"``) instead of the class labels of ``leantrain.data.labels``;
``label_kind`` tells ``model.task=auto`` whether the training labels are scores (numbers that are not all whole)."""

from __future__ import annotations

from dataclasses import dataclass, field

import datasets
import pyarrow as pa
import pyarrow.compute as pc

from leantrain.config import DataConfig
from leantrain.data.labels import nonzero
from leantrain.data.sources import Part


@dataclass
class ScoreMap:
    """The 'label map' of scores: one output named ``score``; ``apply`` casts the label column to float32."""

    names: list[str] = field(default_factory=lambda: ["score"])

    def apply(self, ds: datasets.Dataset, col: str = "label") -> datasets.Dataset:
        return ds if ds.features[col] == datasets.Value("float32") else ds.cast_column(col, datasets.Value("float32"))


def _numbers(part: Part, col: str) -> tuple[pa.ChunkedArray | None, list[str]]:
    arr = part.ds.with_format("arrow")[col]
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        return None, [f"{part.where}: label column {col!r} holds {part.ds.features[col]}; scores (regression) must "
                      "be numbers"]
    arr = arr.cast(pa.float64())
    problems = []
    if (idx := nonzero(pc.is_null(arr))).size:
        problems.append(f"{part.where}: {len(idx)} row{'s' if len(idx) > 1 else ''} with no score in column "
                        f"{col!r} ({part.rows(idx)})")
    if (idx := nonzero(pc.invert(pc.is_finite(arr)))).size:
        problems.append(f"{part.where}: {len(idx)} row{'s' if len(idx) > 1 else ''} with a score that is not a "
                        f"finite number in column {col!r} ({part.rows(idx)})")
    return arr, problems


def score_labels(cfg: DataConfig, col: str | None, parts: list[Part], known: list[str] | None
                 ) -> tuple[ScoreMap | None, list[str], list[str], list[str]]:
    """(map, notes, warnings, problems) for score labels; parts[0] is the training data (or the one input)."""
    problems, notes = [], []
    present = [p for p in parts if col is not None and col in p.ds.column_names]
    if not present or present[0] is not parts[0]:
        return None, [], [], []
    for part in present:
        arr, more = _numbers(part, col)
        problems += more
        if arr is not None and not more and part is parts[0] and len(arr):
            lo, hi = pc.min_max(arr).values()
            notes.append(f"labels: scores (regression) in column {col!r}, from {lo.as_py():g} to {hi.as_py():g}")
    return (None if problems else ScoreMap()), notes, [], problems


def looks_like_scores(part: Part, col: str | None) -> bool:
    """Labels that are numbers and not all whole: scores, not classes."""
    if col is None or col not in part.ds.column_names:
        return False
    arr = part.ds.with_format("arrow")[col]
    if not pa.types.is_floating(arr.type):
        return False
    return bool(nonzero(pc.not_equal(arr, pc.floor(arr))).size)
