"""Tasks: which Auto model class a run builds, and how ``model.task=auto`` is decided.

auto: the model's config decides when its model type belongs to exactly one task's model mapping (a ViT is an
image classifier, a wav2vec2 an audio classifier); otherwise ``data.image_column`` / ``data.audio_column`` hint
at images or audio; otherwise text classification (the packaged default model).
"""

from __future__ import annotations

from leantrain.errors import ConfigError, UserError

TEXT, IMAGE, AUDIO = "text-classification", "image-classification", "audio-classification"
AUTO_MODEL = {TEXT: "AutoModelForSequenceClassification", IMAGE: "AutoModelForImageClassification",
              AUDIO: "AutoModelForAudioClassification"}


# The task decides transformers' config.problem_type (it picks the loss a loaded model computes): an override
# that contradicts it would train one loss and save a model that computes another.
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


def auto_model_class(task: str):
    import transformers

    return getattr(transformers, AUTO_MODEL[task])


def _mappings() -> dict[str, dict]:
    from transformers.models.auto import modeling_auto as m

    return {TEXT: m.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, IMAGE: m.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
            AUDIO: m.MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES}


def task_of_config(config) -> str | None:
    """The one task whose model mapping holds the config's model type, else None (unknown or ambiguous)."""
    kind = getattr(config, "model_type", None)
    found = [task for task, names in _mappings().items() if kind in names]
    return found[0] if len(found) == 1 else None


def resolve_task(cfg) -> str:  # cfg: leantrain.config.Config
    """``model.task``, or what ``auto`` decides (see the module docstring). Reads config.json at most."""
    m = cfg.model
    if m.task != "auto":
        return m.task
    if m.name or m.config or m.config_type:
        from leantrain.modeling import load_config

        try:
            task = task_of_config(load_config(m))
        except ConfigError:
            raise
        except UserError:  # an unreachable Hub id: building the model reports it
            task = None
        if task is not None:
            return task
    if cfg.data.image_column:
        return IMAGE
    if cfg.data.audio_column:
        return AUDIO
    return TEXT
