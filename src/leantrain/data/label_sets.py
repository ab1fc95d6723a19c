"""Label sets (multi-label classification): several label names per row, as a list (JSON/JSONL
``{"labels": ["joy", "love"]}``) or as one string split at ``data.label_separator``; an empty list (or an empty string / empty
CSV field) is a row with no label. The names are sorted; ``LabelSetMap.apply`` turns each row's names into a float multi-hot vector.
The label reader a task picks by name (``labels="label_sets"``); ``looks_like_label_sets`` tells ``model.task=auto``
that list-valued labels are label sets."""

from __future__ import annotations

from dataclasses import dataclass

import datasets
import pyarrow as pa

from leantrain.config import DataConfig
from leantrain.data.sources import Part


def _is_list(arr) -> bool:
    return pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)


def names_of(value, sep: str | None) -> list[str] | None:
    """The label names of one row's value; None when the value is not a list (or a string with ``sep`` set)."""
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if v is not None and str(v).strip()]
    if value is None and sep is not None:  # an empty CSV field: no label
        return []
    if isinstance(value, str) and sep is not None:
        return [p.strip() for p in value.split(sep) if p.strip()]
    return None


@dataclass
class LabelSetMap:
    """The label names (sorted) and the separator; ``apply`` makes the label column a multi-hot float32 list."""

    names: list[str]
    sep: str | None = None

    def apply(self, ds: datasets.Dataset, col: str = "label") -> datasets.Dataset:
        index = {n: i for i, n in enumerate(self.names)}

        def hot(batch):
            out = []
            for value in batch[col]:
                row = [0.0] * len(self.names)
                for name in names_of(value, self.sep) or []:
                    row[index[name]] = 1.0
                out.append(row)
            return {col: out}

        features = ds.features.copy()
        features[col] = datasets.Sequence(datasets.Value("float32"))
        return ds.map(hot, batched=True, features=features, desc="Label sets")


def _values(part: Part, col: str) -> list:
    return part.ds.with_format("arrow")[col].to_pylist()


def label_set_labels(cfg: DataConfig, col: str | None, parts: list[Part], known: list[str] | None
                     ) -> tuple[LabelSetMap | None, list[str], list[str], list[str]]:
    """(map, notes, warnings, problems) for label sets; parts[0] is the training data (or the one input)."""
    sep = cfg.label_separator
    present = [p for p in parts if col is not None and col in p.ds.column_names]
    if not present or present[0] is not parts[0]:
        return None, [], [], []
    problems, seen = [], []
    for part in present:
        bad, names = [], set()
        for i, value in enumerate(_values(part, col)):
            got = names_of(value, sep)
            if got is None:
                bad.append(i)
            else:
                names.update(got)
        if bad:
            how = f"a string split at data.label_separator={sep!r}" if sep is not None else (
                "a list of label names (or set data.label_separator for delimited strings)")
            problems.append(f"{part.where}: {len(bad)} row{'s' if len(bad) > 1 else ''} whose label in column "
                            f"{col!r} is not {how} ({part.rows(bad)})")
        seen.append(names)
    if problems:
        return None, [], [], problems
    names = list(known) if known is not None else sorted(seen[0])
    for part, got in zip(present, seen):
        if unknown := sorted(got - set(names)):
            problems.append(f"{part.where}: label names in column {col!r} that the "
                            f"{'trained model' if known is not None else 'training data'} lacks: "
                            f"{', '.join(map(repr, unknown[:10]))}")
    if problems:
        return None, [], [], problems
    if not names:
        return None, [], [], [f"{parts[0].where}: no label names in column {col!r}; multi-label needs at least one"]
    notes = [] if col.startswith("__leantrain") else [  # 0/1 columns (data.label_columns) have their own note
        f"labels: label sets (multi-label) in column {col!r}, {len(names)} names: {', '.join(names[:20])}"]
    return LabelSetMap(names, sep), notes, [], []


def looks_like_label_sets(part: Part, col: str | None, sep: str | None = None) -> bool:
    """Labels that are lists (or any labels when ``data.label_separator`` is set): label sets, multi-label."""
    if col is None or col not in part.ds.column_names:
        return False
    return sep is not None or _is_list(part.ds.with_format("arrow")[col])
