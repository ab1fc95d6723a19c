"""The per-row count cache of the loss's denominator (methods/row_counts.py), shared by the causal LM and
token classification: a dataset's count column is read once, another dataset is read afresh."""

from __future__ import annotations

import numpy as np
import pytest

from leantrain.methods import get_task
from leantrain.methods.row_counts import RowCounts


class Counted:
    """A processed dataset's count columns that records every read of a column."""

    def __init__(self, **columns):  # noqa: ANN003
        self.columns = columns
        self.reads: list[str] = []

    def __getitem__(self, name: str):  # noqa: ANN204
        self.reads.append(name)
        return self.columns[name]


def test_a_column_is_read_once_per_dataset_and_another_dataset_is_read_afresh():
    counts = RowCounts()
    a = Counted(n=[3, 1, 4], m=[1, 1, 1])
    assert counts.total(a, "n", [0, 2, -1]) == 7  # negative: padding indices, no rows
    assert counts.total(a, "n", np.array([1, 1])) == 2
    assert a.reads == ["n"]  # the second call did not read again
    assert counts.total(a, "m", [0, 1, 2]) == 3 and a.reads == ["n", "m"]  # another column: read
    b = Counted(n=[10, 20, 30])
    assert counts.total(b, "n", [0, 2]) == 40 and b.reads == ["n"]  # another dataset: its own counts
    assert counts.total(a, "n", [0]) == 3 and a.reads == ["n", "m"]
    assert counts.column(b, "n").dtype == np.int64


@pytest.mark.parametrize(("task", "column"), [("causal-lm", "targets"), ("token-classification", "n_first")])
def test_both_tasks_read_their_count_column_once(task, column):
    data = Counted(**{column: [2, 5, 0, 7]})
    t = get_task(task)
    assert t.data.count(data, [0, 1, -1]) == 7
    assert t.data.count(data, [3, 2]) == 7
    assert data.reads == [column]
