"""The names of the metrics evaluation produces, in one place: the evaluator builds its result from them and the
config checks ``train.stop_when`` / ``checkpoint.best_metric`` against them before any work. (The task registry can
supply them per task: today every task is a classifier.)"""

from __future__ import annotations

CLASSIFICATION = ("accuracy", "f1_macro", "mcc", "loss")  # mcc: two classes only
TWO_CLASS_ONLY = ("mcc",)


def metric_names(num_labels: int | None = None) -> list[str]:
    """The metrics evaluation reports for a classifier with ``num_labels`` classes (None: any number)."""
    return [m for m in CLASSIFICATION if num_labels in (None, 2) or m not in TWO_CLASS_ONLY]
