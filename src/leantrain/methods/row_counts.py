"""Per-row counts of a processed training dataset (a causal LM's target tokens, token classification's labelled
sub-tokens), read from the dataset once and then summed over a batch's rows on the host: the loss's denominator
(``Task.data.count``) without a pass over Arrow at every step."""

from __future__ import annotations

import weakref

import numpy as np


class RowCounts:
    """Each dataset's count columns as int64 arrays, read on first use and held while the dataset lives (weak keys:
    nothing outlives its dataset, and another dataset is always read afresh)."""

    def __init__(self) -> None:
        self._held: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # dataset -> {column: counts}

    def column(self, dataset, name: str) -> np.ndarray:  # noqa: ANN001
        """Column ``name`` of ``dataset`` as int64, read once per dataset (each time for a dataset that cannot be
        weakly referenced)."""
        try:
            held = self._held.setdefault(dataset, {})
        except TypeError:  # not weak-referenceable: read each time
            held = {}
        if name not in held:
            held[name] = np.asarray(dataset[name], dtype=np.int64)
        return held[name]

    def lengths(self, dataset, names: tuple[str, ...]) -> np.ndarray:  # noqa: ANN001
        """The summed lengths of the list columns ``names`` per row, int64, read once per dataset (held under the
        key ``+``-joined names)."""
        key = "+".join(names)
        try:
            held = self._held.setdefault(dataset, {})
        except TypeError:
            held = {}
        if key not in held:
            import pyarrow.compute as pc

            table = dataset.with_format("arrow")[:]
            held[key] = sum(np.asarray(pc.list_value_length(table.column(n)), dtype=np.int64) for n in names)
        return held[key]

    def total(self, dataset, name: str, indices) -> int:  # noqa: ANN001
        """The sum of column ``name`` over the rows ``indices`` (padding indices, negative, hold none)."""
        indices = np.asarray(indices, dtype=np.int64)
        return int(self.column(dataset, name)[indices[indices >= 0]].sum())
