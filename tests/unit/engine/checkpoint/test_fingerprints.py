"""What a resume and the precomputed-values cache compare: a fingerprint of every column's content of the processed
data (pairs' chosen / rejected tokens, feedback's labels, texts), not the row count and lengths (issue 35, probe 1)."""

from __future__ import annotations

import datasets

from leantrain.engine.checkpoint.save import data_fingerprint


def pairs(swap_row: int | None = None) -> datasets.Dataset:
    rows = []
    for i in range(6):
        chosen, rejected = [5, 6, 7 + i], [5, 6, 20 + i]  # the same lengths: only the content tells them apart
        if i == swap_row:
            chosen, rejected = rejected, chosen
        rows.append({"chosen_input_ids": chosen, "chosen_labels": [-100, 6, chosen[-1]],
                     "rejected_input_ids": rejected, "rejected_labels": [-100, 6, rejected[-1]], "length": 3})
    return datasets.Dataset.from_list(rows)


def test_swapping_chosen_and_rejected_in_one_row_changes_the_fingerprint():
    base = data_fingerprint(pairs())
    assert data_fingerprint(pairs()) == base  # stable
    assert data_fingerprint(pairs(swap_row=4)) != base


def test_every_column_counts_feedback_labels_floats_and_texts():
    rows = [{"input_ids": [1, 2], "desirable": 1, "score": 0.25, "text": "a b"},
            {"input_ids": [3, 4], "desirable": 0, "score": 0.5, "text": "c d"}]
    base = data_fingerprint(datasets.Dataset.from_list(rows))
    for key, value in (("desirable", 1), ("score", 0.75), ("text", "c e")):
        changed = [dict(rows[0]), {**rows[1], key: value}]
        assert data_fingerprint(datasets.Dataset.from_list(changed)) != base, key
    moved = [{**rows[0], "input_ids": [1]}, {**rows[1], "input_ids": [2, 3, 4]}]  # the same tokens, other rows
    assert data_fingerprint(datasets.Dataset.from_list(moved)) != base


def test_a_selection_is_fingerprinted_by_the_rows_it_holds():
    ds = pairs()
    held = ds.select([1, 3])
    assert data_fingerprint(held) == data_fingerprint(datasets.Dataset.from_list([ds[1], ds[3]]))
    assert data_fingerprint(held) != data_fingerprint(ds.select([1, 2]))


def test_a_column_of_nulls_fingerprints_the_same_every_time():
    """An all-None column (Arrow's null type: a GRPO environment without tools) is hashed by its mask, not by the
    addresses of the None objects numpy would give."""
    import datasets

    rows = {"prompt": ["a", "b"], "tools": [None, None]}
    first = data_fingerprint(datasets.Dataset.from_dict(rows))
    assert all(data_fingerprint(datasets.Dataset.from_dict(dict(rows))) == first for _ in range(3))
    assert data_fingerprint(datasets.Dataset.from_dict({"prompt": ["a", "b"], "tools": ["x", None]})) != first
