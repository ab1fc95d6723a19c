"""The problem_type each task implies (transformers' ``config.problem_type`` picks the loss a loaded model computes),
checked at config time: an override that contradicts the task would train one loss and save a model that computes
another. Each task's spec (``leantrain.config.tasks``) names its problem_type."""

from __future__ import annotations

from leantrain.config.tasks import SPECS, TEXT
from leantrain.errors import ConfigError


def check_problem_type(task: str, overrides: dict) -> None:
    """``model.config_overrides.problem_type`` must be absent or the task's own; under ``model.task=auto`` that of
    the classifiers (another problem type needs its task named: ``model.task=text-regression``)."""
    if "problem_type" not in overrides:
        return
    given = overrides["problem_type"]
    allowed = {SPECS[task].problem_type} if task in SPECS else {SPECS[TEXT].problem_type}
    if given not in allowed:
        owner = [s.name for s in SPECS.values() if s.problem_type == given]
        raise ConfigError(
            f"model.config_overrides.problem_type={given!r} contradicts the task ({task}): the task decides "
            f"problem_type ({' or '.join(sorted(allowed))}); remove the override"
            + (f" and set model.task={owner[0]}" if owner else ""))
