"""The names of the metrics evaluation produces, in one place: the evaluator builds its result from them and the
config checks ``train.stop_when`` / ``checkpoint.best_metric`` against them before any work. Each task's spec
(``leantrain.config.tasks``) lists its own."""

from __future__ import annotations

from leantrain.config.tasks import CLASSIFICATION_METRICS, SPECS, task_spec

CLASSIFICATION = CLASSIFICATION_METRICS
TWO_CLASS_ONLY = ("mcc",)


def metric_names(num_labels: int | None = None, task: str | None = None) -> list[str]:
    """The metrics evaluation reports for ``task`` with ``num_labels`` labels (None: any number); with no task,
    those of every registered task."""
    specs = [task_spec(task)] if task is not None else list(SPECS.values())
    names: list[str] = []
    for spec in specs:
        names += [m for m in spec.metrics if m not in names
                  and (num_labels in (None, 2) or m not in spec.two_class_only)]
    return names


def lower_is_better(name: str, task: str | None = None) -> bool:
    """Whether a smaller value of metric ``name`` is better (eval.loss, eval.mse, ...)."""
    specs = [task_spec(task)] if task is not None else list(SPECS.values())
    return any(name in spec.lower_is_better for spec in specs)
