"""``leantrain inspect``: a model's config and parameter counts, as text or JSON."""

from __future__ import annotations

import json
import textwrap

from leantrain.config import ModelConfig
from leantrain.modeling import inspect_model


def inspect_command(name: str, *, as_json: bool = False) -> int:
    info = inspect_model(ModelConfig(name=name))
    if as_json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"model: {info['name']}  ({info['class']})")
    for k, v in info["parameters"].items():
        print(f"  {k + ' parameters:':<28} {v:>14,}")
    print("config:")
    print(textwrap.indent(json.dumps(info["config"], indent=2), "  "))
    return 0
