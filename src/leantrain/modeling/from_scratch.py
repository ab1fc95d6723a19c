"""Models without the Hub: a config from ``model.config`` (a config.json) or ``model.config_type`` (a model type's
defaults), plus ``model.config_overrides``; and the matching image processor / feature extractor built from that
config, since ``AutoImageProcessor`` cannot load from a folder holding only config.json.

The processor takes the sizes that must agree with the model from its config: an image processor resizes to
``config.image_size`` (ViT's processor defaults to 224 px whatever the model), a feature extractor takes
``sampling_rate`` / ``num_mel_bins`` / ``max_length`` where the config has them, and returns an attention mask
for wav2vec2-style models with layer-norm feature encoders (those are trained with one).
"""

from __future__ import annotations

import difflib
import inspect
import json
from pathlib import Path
from typing import Any

from leantrain.config import ModelConfig
from leantrain.config.base import check_number
from leantrain.errors import ConfigError


def from_scratch(cfg: ModelConfig) -> bool:
    return bool(cfg.config or cfg.config_type)


def _read_config_file(spec: str) -> tuple[str, dict]:
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"model.config: file not found: {path}")
    try:
        values = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"model.config: {path} is not valid JSON ({e})") from None
    if not isinstance(values, dict) or not values.get("model_type"):
        raise ConfigError(f"model.config: {path} has no \"model_type\" (e.g. \"vit\", \"wav2vec2\")")
    return values.pop("model_type"), values


def config_from_spec(cfg: ModelConfig):
    """A fresh ``PretrainedConfig`` from model.config or model.config_type, with model.config_overrides applied."""
    from transformers import CONFIG_MAPPING, AutoConfig

    if cfg.config and cfg.config_type:
        raise ConfigError("set model.config (a config.json) or model.config_type (a model type), not both")
    kind, values = _read_config_file(cfg.config) if cfg.config else (cfg.config_type, {})
    key = "model.config" if cfg.config else "model.config_type"
    if kind not in CONFIG_MAPPING:
        hint = difflib.get_close_matches(kind, list(CONFIG_MAPPING.keys()), n=1)
        raise ConfigError(f"{key}: unknown model type {kind!r}" + (f" — did you mean {hint[0]!r}?" if hint else ""))
    check_config_overrides(AutoConfig.for_model(kind, **values), cfg.config_overrides)
    try:  # built in one go, so that derived fields agree (e.g. ConvNeXt's stage names with num_stages)
        return AutoConfig.for_model(kind, **{**values, **cfg.config_overrides})
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{key}: a {kind} config with model.config_overrides is invalid: {e}") from None


def check_config_overrides(config, overrides: dict[str, Any]) -> None:
    """Every key of ``model.config_overrides`` must be a field of the model's config (with a did-you-mean), and
    its value pass the number checks every config key passes (finite, a sane magnitude), a count stay a positive
    whole number, and the heads divide the hidden size (``_value_problems``)."""
    known = config.to_dict()
    problems = []
    for k, v in overrides.items():
        if k not in known:
            hint = difflib.get_close_matches(k, sorted(known), n=1)
            problems.append(f"model.config_overrides.{k}: not a field of {type(config).__name__}"
                            + (f" — did you mean {hint[0]!r}?" if hint else ""))
        else:
            problems += _value_problems(k, v, known[k])
    if not problems:
        problems = _division_problems(config, overrides)
    if problems:
        raise ConfigError("bad model.config_overrides:", problems)


COUNT_PREFIXES, COUNT_SUFFIXES = ("num_", "n_"), ("_size", "_dim", "_positions", "_position_embeddings", "_layers",
                                                    "_heads", "_ctx")


def _value_problems(key: str, value: Any, default: Any) -> list[str]:
    """A value of ``model.config_overrides``: finite and of sane magnitude (``config.base``); where the config holds
    a whole number, a whole number; where that number is a positive count (sizes, layers, heads, positions), > 0."""
    name = f"model.config_overrides.{key}={value!r}"
    try:
        check_number(value)
    except ValueError as e:
        return [f"{name}: {e}"]
    if isinstance(default, float) and isinstance(value, str):
        return [f"{name}: the config holds a number here (e.g. {default}); give one"]
    if isinstance(default, bool) or not isinstance(default, int):
        return []
    if isinstance(value, (float, str)):  # (a list stays allowed: e.g. several eos_token_id)
        return [f"{name}: the config holds a whole number here (e.g. {default}); give one"]
    count = key.startswith(COUNT_PREFIXES) or key.endswith(COUNT_SUFFIXES)
    if count and default > 0 and isinstance(value, int) and value <= 0:
        return [f"{name}: a count, so at least 1"]
    return []


def _division_problems(config, overrides: dict[str, Any]) -> list[str]:
    """With the hidden size or the heads overridden: the attention heads divide the hidden size (unless head_dim is
    given too), and the key/value heads divide the attention heads."""
    import copy

    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads")
    if not any(config.attribute_map.get(k, k) in overrides or k in overrides for k in keys):
        return []
    new = copy.deepcopy(config)
    new.update(overrides)
    hidden, heads = getattr(new, "hidden_size", None), getattr(new, "num_attention_heads", None)
    kv = getattr(new, "num_key_value_heads", None)
    problems = []
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads and "head_dim" not in overrides:
        key = "hidden_size" if "hidden_size" in overrides or "num_attention_heads" not in overrides else "num_attention_heads"
        problems.append(f"model.config_overrides.{key}: hidden_size={hidden} is not divisible by num_attention_heads="
                        f"{heads} (each head gets hidden_size / heads dimensions); e.g. hidden_size="
                        f"{hidden // heads * heads or heads}")
    if isinstance(kv, int) and isinstance(heads, int) and kv > 0 and heads % kv:
        key = "num_key_value_heads" if "num_key_value_heads" in overrides else "num_attention_heads"
        problems.append(f"model.config_overrides.{key}: num_attention_heads={heads} is not divisible by "
                        f"num_key_value_heads={kv} (each key/value head serves a whole group of heads)")
    return problems


def build_processor(config, kind: str):
    """The image processor or feature extractor (``kind``, a task's processor) of the config's model type, sized
    from the config."""
    if kind == "image_processor":
        return _image_processor(config)
    if kind == "feature_extractor":
        return _feature_extractor(config)
    raise ValueError(kind)


def _image_processor(config):
    from transformers.models.auto.image_processing_auto import (
        IMAGE_PROCESSOR_MAPPING_NAMES,
        get_image_processor_class_from_name,
    )
    from transformers.utils import is_torchvision_available

    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(config.model_type)
    if not names:
        raise ConfigError(f"model type {config.model_type!r} has no image processor in transformers")
    backend = "torchvision" if is_torchvision_available() and names.get("torchvision") else "pil"
    cls = get_image_processor_class_from_name(names.get(backend) or next(v for v in names.values() if v))
    size = getattr(config, "image_size", None)
    if not size:
        return cls()  # e.g. ResNet: its config has no image size; the processor's default applies
    h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]
    default = cls()
    kwargs = {"size": {"shortest_edge": min(h, w)} if getattr(default.size, "shortest_edge", None)
              else {"height": h, "width": w}}
    if getattr(default, "crop_size", None):
        kwargs["crop_size"] = {"height": h, "width": w}
    if getattr(default, "crop_pct", None):
        kwargs["crop_pct"] = 1.0  # the whole image at the model's size: no resize-up-then-crop
    return cls(**kwargs)


def _feature_extractor(config):
    from transformers.models.auto.feature_extraction_auto import (
        FEATURE_EXTRACTOR_MAPPING_NAMES,
        feature_extractor_class_from_name,
    )

    name = FEATURE_EXTRACTOR_MAPPING_NAMES.get(config.model_type)
    if not name:
        raise ConfigError(f"model type {config.model_type!r} has no feature extractor in transformers")
    cls = feature_extractor_class_from_name(name)
    params = inspect.signature(cls.__init__).parameters
    kwargs = {k: getattr(config, k) for k in ("sampling_rate", "num_mel_bins", "max_length")
              if k in params and getattr(config, k, None) is not None}
    if "return_attention_mask" in params and hasattr(config, "feat_extract_norm"):
        kwargs["return_attention_mask"] = config.feat_extract_norm == "layer"
    return cls(**kwargs)
