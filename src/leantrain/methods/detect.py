"""``model.task=auto``: which task a run is, from the model's config (read by the caller, once) and the data keys.

In order: a config whose architectures name a causal LM (``LlamaForCausalLM``, ``GPT2LMHeadModel``) and no label
column is a causal LM; a causal-LM model type built from a config (``model.config`` / ``model.config_type``) with
``model.tokenizer`` or plain-text data is one; a model type in exactly one task's model mapping decides
(``task_of_config``: a ViT is an image classifier, a wav2vec2 an audio classifier); plain-text data with no label
column is language modelling; ``data.image_column`` / ``data.audio_column`` hint at images or audio; otherwise the text
task. Training then refines the text task by its labels (``leantrain.engine.setup.training_data.run_task_reason``).
"""

from __future__ import annotations

from pathlib import Path

from leantrain.config import Config
from leantrain.config.tasks import CAUSAL_LM
from leantrain.modeling.from_scratch import from_scratch
from leantrain.methods.registry import Task, default_task, get_task, task_of_config
from leantrain.modeling.load import detection_config
from leantrain.modeling.names import CLASSIFIER_ARCHS


def causal_lm_architecture(config) -> str | None:
    """The config's causal-LM architecture (``LlamaForCausalLM``, ``GPT2LMHeadModel``), unless it also names a
    classifier; None otherwise."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # lazy: heavy

    archs = getattr(config, "architectures", None) or []
    if any(c in a for a in archs for c in CLASSIFIER_ARCHS):
        return None
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    return next((a for a in archs if a in causal or a.endswith("ForCausalLM")), None)


def builds_causal_lm(config) -> bool:
    """The config's model type has a causal-LM class (a model built from it can be one)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # lazy: heavy

    return getattr(config, "model_type", None) in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def plain_text_data(cfg) -> bool:  # noqa: ANN001 - leantrain Config
    """The training data is plain text (.txt files, a glob of them) or a folder of token shards from ``leantrain
    prepare`` (its manifest.json), and no label column is named: language-model data."""
    train = cfg.data.train
    if not train or cfg.data.label_column:
        return False
    return str(train).lower().endswith(".txt") or (Path(train) / "manifest.json").is_file()


def detect_task(cfg, config) -> tuple[str, str]:  # noqa: ANN001 - leantrain Config, transformers config
    """(the task's name, why: what ``model.task=auto`` decided it from; "" when model.task is set). ``config``: the
    model's config (None: there is none to read, e.g. an unreachable Hub id)."""
    m = cfg.model
    if m.task != "auto":
        return m.task, ""
    if config is not None:
        arch = causal_lm_architecture(config)
        if arch is not None and not cfg.data.label_column:  # a label column: a classifier made from a base LM
            return CAUSAL_LM, f"the model is a {arch}"
        if from_scratch(m) and builds_causal_lm(config) and (m.tokenizer or plain_text_data(cfg)):
            key = "model.config" if m.config else "model.config_type"
            why = "model.tokenizer is set" if m.tokenizer else "the training data is plain text"
            return CAUSAL_LM, f"{key} builds a {config.model_type} causal LM and {why}"
        task = task_of_config(config)
        if task is not None and not (task == CAUSAL_LM and cfg.data.label_column):  # a label column: a classifier
            return task, f"the model's config ({config.model_type})"
    if plain_text_data(cfg):
        return CAUSAL_LM, "the training data is plain text with no label column"
    if cfg.data.image_column:
        return default_task("image"), "data.image_column"
    if cfg.data.audio_column:
        return default_task("audio"), "data.audio_column"
    return default_task("text"), "text data"


def resolve_task(cfg: Config) -> Task:
    """``model.task``, or what ``auto`` decides (``leantrain.methods.detect``). Reads config.json at most."""
    return resolve_task_reason(cfg)[0]


def resolve_task_reason(cfg: Config) -> tuple[Task, str]:
    """(the task, why ``model.task=auto`` chose it; "" when model.task is set): ``detect_task`` on the model's
    config, read here (only under auto)."""
    name, why = detect_task(cfg, detection_config(cfg.model) if cfg.model.task == "auto" else None)
    return get_task(name), why
