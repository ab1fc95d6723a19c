"""Loading: defaults < YAML file < ``key=value`` overrides (dotted keys), with "did you mean" for unknown keys and
the key and expected type for bad values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from leantrain.config.hints import describe_unknown
from leantrain.config.sections import Config
from leantrain.config.strict_yaml import DuplicateKeyError, safe_load_strict
from leantrain.errors import ConfigError


def walk_fields(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every settable key in schema order, as (dotted key, its pydantic field): the one walk over the schema that
    ``known_keys``, ``--help`` (``describe_keys``) and docs/config.md (``leantrain.config.reference``) share."""
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from walk_fields(ann, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


def field_default(field: FieldInfo) -> Any:
    """The value a key takes when nobody sets it."""
    return field.default_factory() if field.default_factory else field.default


def known_keys(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Every dotted key a user may set, e.g. ``train.lr``."""
    return [key for key, _ in walk_fields(model, prefix)]


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


def overrides_tree(overrides: list[str]) -> dict[str, Any]:
    """``["train.lr=3e-5", ...]`` -> ``{"train": {"lr": 3e-5}, ...}``: the mapping a YAML file with them would hold."""
    tree: dict[str, Any] = {}
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(tree, key, value)
    return tree


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
        problems.append(describe_unknown(key, sorted(valid)))
    if problems:
        raise ConfigError(f"bad config in {source}:", problems)


def _describe_validation(err: ValidationError, tree: dict[str, Any]) -> list[str]:
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not isinstance(p, int) or True)
        value = e.get("input")
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "literal_error":
            msg = "expected " + msg.removeprefix("Input should be ")
        elif e["type"].endswith("_parsing") or e["type"].endswith("_type"):
            msg = "expected " + msg.removeprefix("Input should be ").removeprefix("a valid ")
        if loc:
            shown = "input" in e and not isinstance(value, dict) and repr(value) not in msg
            out.append(f"{loc}: {msg} (got {value!r})" if shown else f"{loc}: {msg}")
        else:
            out.append(msg.removeprefix("Value error, "))
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        tree = safe_load_strict(p.read_text()) or {}
    except DuplicateKeyError as e:
        raise ConfigError(f"config file {p}: {e}") from None
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
    over = overrides_tree(overrides or [])
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
    for key, field in walk_fields():
        text = f"  {key} = {json.dumps(field_default(field), default=str)}"
        if field.description:
            text = f"{text:<44} {field.description}"
        lines.append(text)
    return "\n".join(lines)
