"""Typed, strict config: defaults < YAML file < key=value overrides (dotted keys).

Every section is a pydantic model with ``extra="forbid"``: a misspelled key fails with a "did you mean" hint,
a bad value names the key and the type it expects. ``resolve()`` is the one entry point.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from leantrain.errors import ConfigError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    name: str | None = Field(
        None, description="Hub id or local folder; unset = the packaged sentence-transformers/all-MiniLM-L6-v2"
    )
    task: Literal["auto", "text-classification", "image-classification", "audio-classification"] = Field(
        "auto", description="auto: from the model's config (its model type), else data.image_column / "
        "data.audio_column, else text-classification"
    )
    config: str | None = Field(
        None, description="train from scratch: a local config.json (or a folder holding one); model.name is then "
        "used only for a text model's tokenizer"
    )
    config_type: str | None = Field(
        None, description="train from scratch from a model type's default config (e.g. vit, convnext, resnet, "
        "wav2vec2, audio-spectrogram-transformer) plus model.config_overrides"
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) to pin")
    trust_remote_code: bool = Field(False, description="run code from the model repo (pin a revision when on)")
    allow_pickle: bool = Field(False, description="allow pickle-based weight files (*.bin); default safetensors only")
    config_overrides: dict[str, Any] = Field(
        default_factory=dict, description="applied to the model's config, e.g. hidden_dropout_prob: 0"
    )


class DataConfig(Section):
    train: str | None = Field(
        None, description="CSV/TSV/JSON/JSONL/Parquet file, save_to_disk folder, or Hub name; unset = built-in demo"
    )
    eval: str | None = Field(None, description="eval data, same forms; unset = a seeded hold-out of train")
    train_split: str = Field("train", description="split to train on when data.train is a multi-split dataset")
    eval_split: str | None = Field(None, description="split to evaluate on (default: validation, then test)")
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="hold-out fraction when no eval data is given")
    text_column: str | None = Field(None, description="auto: sentence, text, sentence1, ...")
    text_pair_column: str | None = Field(None, description="second text of a pair; auto: sentence2, ...")
    label_column: str | None = Field(None, description="auto: label, labels")
    label_order: Literal["sorted", "first_seen"] = Field(
        "sorted", description="how string labels map to ids"
    )
    label_names: list[str] | None = Field(None, description="names for integer labels 0..K-1 (id order)")
    max_length: int = Field(128, gt=0, description="tokens per example; longer inputs are truncated")
    image_column: str | None = Field(
        None, description="images: column of image file paths (relative to the data file); auto: image, path, file, ..."
    )
    audio_column: str | None = Field(
        None, description="audio: column of audio file paths (relative to the data file); auto: audio, path, file, ..."
    )
    augment: bool = Field(
        False, description="images: light training augmentation on the fly (random resized crop, horizontal flip)"
    )
    max_seconds: float | None = Field(30.0, gt=0, description="audio: clips are cut to this length; null = no cap")
    batching: Literal["grouped", "dynamic", "padded"] = Field(
        "grouped", description="grouped: length-grouped, padded per batch; dynamic: shuffled, padded per batch; "
        "padded: shuffled, padded to max_length"
    )
    group_size: int = Field(50, gt=0, description="length grouping: mega-batch size in global batches")
    drop_last: bool = Field(False, description="drop a final global batch smaller than train.batch_size")
    max_train_samples: int | None = Field(None, gt=0, description="take the first N training rows (smoke runs)")
    max_eval_samples: int | None = Field(None, gt=0, description="take the first N eval rows")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes")


class TrainConfig(Section):
    epochs: float = Field(3.0, gt=0, description="passes over the training data (ignored when max_steps > 0)")
    max_steps: int = Field(0, ge=0, description="optimizer steps; > 0 overrides epochs")
    batch_size: int = Field(32, gt=0, description="global batch: examples per optimizer step over all processes")
    micro_batch_size: int | None = Field(
        None, gt=0, description="examples per process per forward pass; unset = batch_size / processes"
    )
    eval_batch_size: int | None = Field(None, gt=0, description="per process; unset = 2 x micro batch")
    lr: float = Field(5e-5, gt=0, description="peak learning rate")
    max_grad_norm: float | None = Field(1.0, gt=0, description="gradient clipping; null = off")
    seed: int = 42
    eval_every_steps: int = Field(
        0, ge=0, description="evaluate every N optimizer steps; 0 = at the end of each epoch (and of training)"
    )
    log_every_steps: int = Field(10, gt=0, description="log loss/lr/throughput every N optimizer steps")
    warmup_steps_excluded: int = Field(
        3, ge=0, description="first optimizer steps left out of samples/s and tokens/s (compile, allocator warm-up)"
    )


class OptimConfig(Section):
    name: Literal["adamw"] = "adamw"
    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    scheduler: Literal["linear", "cosine", "constant"] = "linear"
    warmup_ratio: float = Field(0.06, ge=0, lt=1, description="share of the steps spent warming up")
    warmup_steps: int | None = Field(None, ge=0, description="overrides warmup_ratio when set")


class ReportConfig(Section):
    trackers: list[Literal["tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive"]] = Field(
        default_factory=list, description="Accelerate trackers, e.g. [tensorboard]; none by default"
    )
    progress: Literal["auto", "bar", "plain", "none"] = Field(
        "auto", description="auto: a bar on a terminal, plain log lines otherwise"
    )
    plots: bool = True


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    output_dir: str | None = Field(None, description="run folder; unset = runs/<date-time>")

    @field_validator("output_dir")
    @classmethod
    def _nonempty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty")
        return v

    @model_validator(mode="after")
    def _batch_sizes_divide(self) -> "Config":
        t = self.train
        if t.micro_batch_size is not None and t.batch_size % t.micro_batch_size:
            raise ValueError(
                f"train.batch_size={t.batch_size} is not a multiple of train.micro_batch_size={t.micro_batch_size}; "
                f"use a micro batch that divides it, e.g. {largest_divisor(t.batch_size, t.micro_batch_size)}"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


# ----------------------------------------------------------------------------------------------- loading


def known_keys(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Every dotted key a user may set, e.g. ``train.lr``."""
    keys = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += known_keys(ann, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _free_form(path: str) -> bool:
    """Keys under a free-form mapping (model.config_overrides.*) are not checked against the schema."""
    return path.startswith("model.config_overrides.")


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value (e.g. train.lr=3e-5)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has no key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{key}: {part!r} is a value, not a section")
        node = nxt
    node[parts[-1]] = value


def _flatten(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and not _free_form(path + ".") and path != "model.config_overrides":
            out += _flatten(v, path + ".")
        else:
            out.append(path)
    return out


def _check_keys(tree: dict[str, Any], source: str) -> None:
    valid = set(known_keys())
    sections = {k.rsplit(".", 1)[0] for k in valid if "." in k}
    problems = []
    for key in _flatten(tree):
        if key in valid or _free_form(key) or key == "model.config_overrides":
            continue
        if key in sections:
            problems.append(f"{key}: is a section; set one of its keys, e.g. {sorted(k for k in valid if k.startswith(key + '.'))[0]}")
            continue
        hint = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
        if not hint:  # a right leaf in the wrong section: train.weight_decay -> optim.weight_decay
            leaf = key.rsplit(".", 1)[-1]
            hint = [k for k in sorted(valid) if k.rsplit(".", 1)[-1] == leaf][:1]
        problems.append(f"unknown key {key!r}" + (f" — did you mean {hint[0]!r}?" if hint else ""))
    if problems:
        raise ConfigError(f"bad config in {source}:", problems)


def _describe_validation(err: ValidationError, tree: dict[str, Any]) -> list[str]:
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not isinstance(p, int) or True)
        value = e.get("input")
        msg = e["msg"]
        if e["type"] == "literal_error":
            msg = "expected " + msg.removeprefix("Input should be ")
        elif e["type"].endswith("_parsing") or e["type"].endswith("_type"):
            msg = "expected " + msg.removeprefix("Input should be ").removeprefix("a valid ")
        if loc:
            out.append(f"{loc}: {msg} (got {value!r})" if "input" in e and not isinstance(value, dict) else f"{loc}: {msg}")
        else:
            out.append(msg.removeprefix("Value error, "))
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        tree = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"config file {p} must hold a mapping of sections (model:, data:, train:, ...)")
    return tree


def resolve(
    source: str | Path | dict[str, Any] | Config | None = None, overrides: list[str] | None = None
) -> Config:
    """Defaults < YAML file (or dict) < ``key=value`` overrides. Raises ConfigError naming the key."""
    if isinstance(source, Config):
        tree = source.to_dict()
        where = "the given Config"
    elif isinstance(source, dict):
        tree = json.loads(json.dumps(source, default=str))
        where = "the given mapping"
    elif source is not None:
        tree = load_yaml(source)
        where = str(source)
    else:
        tree, where = {}, "defaults"
    _check_keys(tree, where)
    over: dict[str, Any] = {}
    for text in overrides or []:
        key, value = parse_override(text)
        _set_dotted(over, key, value)
    _check_keys(over, "overrides")
    for key in _flatten(over):
        node = over
        for part in key.split("."):
            node = node[part]
        _set_dotted(tree, key, node)
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(f"bad config ({where}{' + overrides' if overrides else ''}):", _describe_validation(e, tree)) from None


def describe_keys() -> str:
    """One line per key with its default and help, for ``--help``."""
    lines = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
                continue
            default = field.default_factory() if field.default_factory else field.default
            text = f"  {prefix}{name} = {json.dumps(default, default=str)}"
            if field.description:
                text = f"{text:<44} {field.description}"
            lines.append(text)

    walk(Config, "")
    return "\n".join(lines)
