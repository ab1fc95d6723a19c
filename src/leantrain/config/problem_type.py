"""The problem_type each task implies (transformers' ``config.problem_type`` picks the loss a loaded model computes),
checked at config time: an override that contradicts the task would train one loss and save a model that computes
another. The task registry (``leantrain.modeling.tasks``) re-exports it."""

from __future__ import annotations

from leantrain.errors import ConfigError

TEXT, IMAGE, AUDIO = "text-classification", "image-classification", "audio-classification"

PROBLEM_TYPE = {TEXT: "single_label_classification", IMAGE: "single_label_classification",
                AUDIO: "single_label_classification"}


def check_problem_type(task: str, overrides: dict) -> None:
    """``model.config_overrides.problem_type`` must be absent or the task's own (``task`` may be ``auto``)."""
    if "problem_type" not in overrides:
        return
    given = overrides["problem_type"]
    allowed = {PROBLEM_TYPE[task]} if task in PROBLEM_TYPE else set(PROBLEM_TYPE.values())
    if given not in allowed:
        raise ConfigError(
            f"model.config_overrides.problem_type={given!r} contradicts the task ({task}): the task decides "
            f"problem_type ({' or '.join(sorted(allowed))}); remove the override"
            + ("" if given not in ("regression", "multi_label_classification") else
               f" ({given.replace('_', '-')} training is planned, not available yet)"))
