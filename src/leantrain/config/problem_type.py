"""The problem_type each task implies (transformers' ``config.problem_type`` picks the loss a loaded model computes),
checked at config time: an override that contradicts the task would train one loss and save a model that computes
another. Each task's spec (``leantrain.config.tasks``) names its problem_type."""

from __future__ import annotations

from leantrain.config.tasks import SPECS
from leantrain.errors import ConfigError


def check_problem_type(task: str, overrides: dict) -> None:
    """``model.config_overrides.problem_type`` must be absent or the task's own (``task`` may be ``auto``)."""
    if "problem_type" not in overrides:
        return
    given = overrides["problem_type"]
    allowed = {SPECS[task].problem_type} if task in SPECS else {s.problem_type for s in SPECS.values()}
    if given not in allowed:
        known = {s.problem_type for s in SPECS.values()}
        raise ConfigError(
            f"model.config_overrides.problem_type={given!r} contradicts the task ({task}): the task decides "
            f"problem_type ({' or '.join(sorted(allowed))}); remove the override"
            + ("" if given not in ("regression", "multi_label_classification") or given in known else
               f" ({given.replace('_', '-')} training is planned, not available yet)"))
