"""Build the model for a task from a Hub id or a local folder; label maps; parameter counts.

Loading is safe by default: safetensors weights only (``model.allow_pickle`` opts into *.bin), no remote code
(``model.trust_remote_code``), and a warning when remote code runs without a pinned revision.
"""

from __future__ import annotations

import difflib
import logging
import re
from pathlib import Path
from typing import Any

from leantrain.config import ModelConfig
from leantrain.errors import ConfigError, UserError
from leantrain.head_reuse import needs_remap, remap_head
from leantrain.model_names import PACKAGED_MODEL, packaged_model_path, resolve_model_name  # noqa: F401
from leantrain.pad_token import ensure_pad_token, set_model_pad_token

log = logging.getLogger("leantrain")


def model_name(cfg: ModelConfig) -> str:
    return resolve_model_name(cfg.name, cfg.revision)


def _hub_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    if cfg.trust_remote_code and not cfg.revision:
        log.warning("model.trust_remote_code is on without model.revision: pin a commit so the code you run can't change")
    return {"revision": cfg.revision, "trust_remote_code": cfg.trust_remote_code}


def _load_error(name: str, err: Exception) -> UserError:
    where = "local folder" if Path(name).exists() else "Hub id (is the Hub reachable? set HF_HUB_OFFLINE=1 to fail fast)"
    return UserError(f"could not load model {name!r} as a {where}: {err}")


def load_config(cfg: ModelConfig):
    from transformers import AutoConfig

    from leantrain.fromconfig import config_from_spec, from_scratch

    if from_scratch(cfg):
        return config_from_spec(cfg)
    from leantrain.hubcheck import check_model_name

    name = model_name(cfg)
    check_model_name(name, cfg.revision)  # a missing folder or an unknown Hub id: named, in seconds
    try:
        return AutoConfig.from_pretrained(name, **_hub_kwargs(cfg))
    except (OSError, ValueError) as e:
        raise _load_error(name, e) from None


def load_tokenizer(cfg: ModelConfig):
    from transformers import AutoTokenizer

    name = model_name(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **_hub_kwargs(cfg))
    except (OSError, ValueError) as e:
        raise _load_error(name, e) from None
    ensure_pad_token(tokenizer, name)  # GPT-2 / Llama-style tokenizers: EOS as pad token
    return tokenizer


def load_processor(cfg: ModelConfig, task: str):
    """The model's own processor: tokenizer (text), image processor (images) or feature extractor (audio).

    A model trained from scratch (model.config / model.config_type) gets one built from its config."""
    from leantrain.tasks import IMAGE, TEXT

    if task == TEXT:
        return load_tokenizer(cfg)
    from leantrain.fromconfig import build_processor, from_scratch

    if from_scratch(cfg):
        return build_processor(load_config(cfg), task)
    from transformers import AutoFeatureExtractor, AutoImageProcessor

    name = model_name(cfg)
    try:
        return (AutoImageProcessor if task == IMAGE else AutoFeatureExtractor).from_pretrained(name, **_hub_kwargs(cfg))
    except (OSError, ValueError) as e:
        raise _load_error(name, e) from None


_CLASSIFIERS = ("ForSequenceClassification", "ForImageClassification", "ForAudioClassification")
_DEFAULT_LABEL = re.compile(r"^LABEL_\d+$")


def trained_label_names(config) -> list[str] | None:
    """The label names a fine-tuned classifier carries, or None for a base model (no head, or LABEL_i names)."""
    id2label = getattr(config, "id2label", None) or {}
    archs = getattr(config, "architectures", None) or []
    if not id2label or not any(c in a for a in archs for c in _CLASSIFIERS):
        return None
    names = [str(id2label[i]) for i in sorted(id2label, key=int)]
    return None if all(_DEFAULT_LABEL.match(n) for n in names) else names


def check_config_overrides(config, overrides: dict[str, Any]) -> None:
    known = set(config.to_dict())
    bad = [k for k in overrides if k not in known]
    if bad:
        problems = []
        for k in bad:
            hint = difflib.get_close_matches(k, sorted(known), n=1)
            problems.append(f"model.config_overrides.{k}: not a field of {type(config).__name__}"
                            + (f" — did you mean {hint[0]!r}?" if hint else ""))
        raise ConfigError("bad model.config_overrides:", problems)


def build_model(cfg: ModelConfig, label_names: list[str], task: str = "text-classification"):
    """The task's AutoModelFor... with the data's labels; a new head when the label set changes.

    With model.config / model.config_type: random initialisation from that config (seeded by the caller)."""
    from leantrain.fromconfig import from_scratch
    from leantrain.tasks import auto_model_class

    auto = auto_model_class(task)
    config = load_config(cfg)
    check_config_overrides(config, cfg.config_overrides)
    n = len(label_names)
    labels = dict(num_labels=n, id2label={i: name for i, name in enumerate(label_names)},
                  label2id={name: i for i, name in enumerate(label_names)})
    if from_scratch(cfg):
        config.update(labels)
        try:
            model = auto.from_config(config)
        except ValueError as e:
            raise UserError(f"cannot build a {task} model from {config.model_type!r} config: {e}") from None
        log.info("new model: random initialisation from a %s config (train.seed)", config.model_type)
        return _with_pad_token(model, cfg, task)
    trained = trained_label_names(config)
    remap = needs_remap(trained, label_names, cfg.reuse_head)  # a fine-tuned head: rows follow the label names
    kwargs = dict(
        **({} if remap else labels),
        use_safetensors=None if cfg.allow_pickle else True,
        ignore_mismatched_sizes=not remap and trained != label_names,  # a new head for a base model
        **_hub_kwargs(cfg),
        **cfg.config_overrides,
    )
    name = model_name(cfg)
    try:
        model, info = auto.from_pretrained(name, output_loading_info=True, **kwargs)
    except (OSError, ValueError) as e:
        if not cfg.allow_pickle and "safetensors" in str(e).lower():
            raise UserError(
                f"model {name!r} has no safetensors weights; leantrain refuses pickle files (*.bin) by default "
                "because loading them can run code. If you trust the source, set model.allow_pickle=true"
            ) from None
        raise _load_error(name, e) from None
    fresh = sorted(set(info.get("missing_keys", [])) | {k for k, *_ in info.get("mismatched_keys", [])})
    if fresh:
        log.info("new weights (initialised from train.seed): %s", ", ".join(fresh[:6]) + (" ..." if len(fresh) > 6 else ""))
    if remap:
        remap_head(model, trained, label_names, cfg.reuse_head)  # logs what it did
    return _with_pad_token(model, cfg, task)


def _with_pad_token(model, cfg: ModelConfig, task: str):
    """A text classifier whose config has no pad_token_id takes the tokenizer's (GPT-2, Llama, ...)."""
    from leantrain.tasks import TEXT

    if task == TEXT and getattr(model.config, "pad_token_id", None) is None:
        set_model_pad_token(model, load_tokenizer(cfg))
    return model


def parameter_counts(model) -> dict[str, int]:
    """Total, trainable, and embedding parameters (input embeddings and position/type embeddings)."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    emb_ids = set()
    for mod in model.modules():
        if type(mod).__name__ == "Embedding":
            emb_ids.update(id(p) for p in mod.parameters())
    embeddings = sum(p.numel() for p in model.parameters() if id(p) in emb_ids)
    return {"total": total, "trainable": trainable, "embeddings": embeddings, "non_embedding": total - embeddings}


def inspect_model(cfg: ModelConfig) -> dict[str, Any]:
    """Config and parameter counts of a model, as ``leantrain inspect`` prints them.

    A fine-tuned classifier is loaded as such; a base model gets the AutoModel it was saved as.
    """
    from transformers import AutoModel

    from leantrain.tasks import TEXT, auto_model_class, task_of_config

    config = load_config(cfg)
    archs = getattr(config, "architectures", None) or []
    classifier = any(c in a for a in archs for c in _CLASSIFIERS)
    auto = auto_model_class(task_of_config(config) or TEXT) if classifier else AutoModel
    name = model_name(cfg)
    try:
        model = auto.from_pretrained(name, use_safetensors=None if cfg.allow_pickle else True, **_hub_kwargs(cfg))
    except (OSError, ValueError) as e:
        raise _load_error(name, e) from None
    return {"name": name, "class": type(model).__name__, "parameters": parameter_counts(model),
            "labels": trained_label_names(config), "config": config.to_diff_dict()}
