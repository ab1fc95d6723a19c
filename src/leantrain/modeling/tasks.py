"""Tasks: which Auto model class a run builds, and which task a model's config belongs to.

The seam for the task registry: each task here (name, Auto class, model mapping) becomes one registry entry.
``model.task=auto`` is decided by ``leantrain.modeling.load.resolve_task``:

auto: the model's config decides when its model type belongs to exactly one task's model mapping (a ViT is an
image classifier, a wav2vec2 an audio classifier); otherwise ``data.image_column`` / ``data.audio_column`` hint
at images or audio; otherwise text classification (the packaged default model).
"""

from __future__ import annotations

from leantrain.config.problem_type import AUDIO, IMAGE, PROBLEM_TYPE, TEXT, check_problem_type  # noqa: F401

AUTO_MODEL = {TEXT: "AutoModelForSequenceClassification", IMAGE: "AutoModelForImageClassification",
              AUDIO: "AutoModelForAudioClassification"}


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


MODALITY = {TEXT: "text", IMAGE: "image", AUDIO: "audio"}  # the data side (``leantrain.data.modalities``) of each task


def modality_of(task: str) -> str:
    """The data modality of a task: which loader, processor and collator its data goes through."""
    try:
        return MODALITY[task]
    except KeyError:
        raise ValueError(f"unknown task {task!r}") from None
