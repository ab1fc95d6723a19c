"""``leantrain inspect``: a model's config and parameter counts, as text or JSON."""

from __future__ import annotations

import json
import textwrap

from leantrain.config import ModelConfig
from leantrain.methods import auto_model_class, default_task, task_of_config
from leantrain.modeling import inspect_model


def classifier_class(config):  # noqa: ANN001, ANN201 - a transformers config; an AutoModelFor... class
    """The AutoModelFor... class of a fine-tuned classifier's config: its task's, else the text classifier's."""
    return auto_model_class(task_of_config(config) or default_task("text"))


def inspect_command(name: str, *, as_json: bool = False) -> int:
    info = inspect_model(ModelConfig(name=name), classifier_class)
    if as_json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"model: {info['name']}  ({info['class']})")
    for k, v in info["parameters"].items():
        print(f"  {k + ' parameters:':<28} {v:>14,}")
    print("config:")
    print(textwrap.indent(json.dumps(info["config"], indent=2), "  "))
    return 0
