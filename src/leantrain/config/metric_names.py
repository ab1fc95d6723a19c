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


def check_metric(name: str, num_labels: int | None = None, task: str | None = None) -> None:
    """ValueError unless evaluation reports metric ``name`` (for ``task``, any when unset, with ``num_labels``
    classes), with did-you-mean."""
    import difflib

    task = task if task in SPECS else None  # auto, unresolved: any task's
    names = metric_names(num_labels, task)
    if name in names:
        return
    if name in metric_names(None, task):
        raise ValueError(f"eval.{name} is reported for 2 classes only; this data has {num_labels}: use one of "
                         + ", ".join(f"eval.{n}" for n in names))
    close = [n for n in names if n.startswith(name)] or difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f" — did you mean eval.{close[0]}?" if close else ""
    raise ValueError(f"evaluation reports no metric {name!r}; it reports "
                     + ", ".join(f"eval.{n}" for n in names) + hint)
