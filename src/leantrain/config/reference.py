"""docs/config.md, generated from the pydantic schema: every key with its type, default and description.

The walk over the schema is ``walk_fields`` (the one ``--help`` and the "did you mean" check use too), so the page
cannot drift from the code: ``tests/unit/test_docs.py`` fails when docs/config.md is stale. Regenerate with

    python -m leantrain.config.reference --write docs/config.md
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from leantrain.config.read import field_default, walk_fields
from leantrain.config.sections import Config
from leantrain.config.tasks import task_names

COMMAND = "python -m leantrain.config.reference --write docs/config.md"

INTRO = f"""\
<!-- Generated from src/leantrain/config/sections.py by `{COMMAND}`. Do not edit by hand. -->

# Configuration reference

Every key leantrain accepts, in the order of the schema, with its type, its default and what it does.

**Sources**, lowest to highest: the defaults below, a YAML file (`leantrain train my.yaml`), then `key=value`
overrides with dotted keys (`train.lr=3e-5`). Override values are parsed as YAML (`data.label_names=[neg,pos]`,
`train.max_grad_norm=null`). Options such as `--print-config` may stand anywhere among the overrides.

**Strict.** A misspelled key exits with status 2 and a "did you mean" hint; a bad value names the key and the type it
expects; keys under `model.config_overrides` are passed to the model's config unchecked. The resolved config is
written to `output_dir/config.yaml`, and `leantrain train --print-config` prints it without training.
`leantrain train --help` lists the same keys in one line each.

A YAML file holds the same sections (see [the examples](../examples/)):

```yaml
model:
  name: path/or/hub-id
data:
  train: train.csv
  text_column: review
train:
  epochs: 2
  lr: 3.0e-5
```
"""


def type_name(annotation: Any) -> str:
    """A key's type in words a config author writes: `auto` | `fp32`, integer, list of string, ... or null."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a) for a in args if a is not type(None)] + (["null"] if type(None) in args else [])
        return ", ".join(names[:-1]) + (" or " if len(names) > 1 else "") + names[-1]
    if origin in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return "[" + ", ".join(type_name(a) for a in args) + "]"
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict or annotation is dict:
        return "mapping"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if annotation in names:
        return names[annotation]
    return "any" if annotation is Any else getattr(annotation, "__name__", str(annotation))


def constraints(field: FieldInfo) -> str:
    """The bounds pydantic enforces (gt / ge / lt / le), e.g. '> 0, < 1'."""
    out = []
    for meta in field.metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            if getattr(meta, attr, None) is not None:
                out.append(f"{sign} {getattr(meta, attr)}")
    return ", ".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _sections() -> list[tuple[str, str, list[tuple[str, FieldInfo]]]]:
    """(title, intro, [(key, field)]) in schema order; top-level keys (output_dir) form their own section."""
    fields = list(walk_fields())
    out: list[tuple[str, str, list[tuple[str, FieldInfo]]]] = []
    for name, field in Config.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            doc = (ann.__dict__.get("__doc__") or "").strip()
            out.append((f"`{name}`", doc, [(k, f) for k, f in fields if k.startswith(name + ".")]))
        elif out and out[-1][0] == "top level":
            out[-1][2].append((name, field))
        else:
            out.append(("top level", "Keys outside any section.", [(name, field)]))
    return out


def render_reference() -> str:
    """The whole of docs/config.md: the intro, then one table per section (key, type, default, description)."""
    parts = [INTRO]
    sections = _sections()
    parts.append("Sections: " + ", ".join(f"[{t}](#{t.strip('`').replace(' ', '-')})" for t, _, _ in sections) + ".\n")
    for title, doc, rows in sections:
        parts.append(f"## {title}\n")
        if doc:
            parts.append(doc + "\n")
        lines = ["| key | type | default | description |", "|---|---|---|---|"]
        for key, field in rows:
            kind = type_name(field.annotation)
            if (field.json_schema_extra or {}).get("choices") == "tasks":  # model.task: the task registry's names
                kind = " | ".join(f"`{n}`" for n in ["auto", *task_names()])
            if bounds := constraints(field):
                kind = f"{kind} ({bounds})"
            default = json.dumps(field_default(field), default=str)
            lines.append(f"| `{key}` | {_cell(kind)} | `{_cell(default)}` | {_cell(field.description or '')} |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m leantrain.config.reference", description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="PATH", help="write the page here (e.g. docs/config.md)")
    g.add_argument("--check", metavar="PATH", help="exit 1 when the page at PATH differs from the schema")
    ns = p.parse_args(argv)
    text = render_reference()
    if ns.write:
        Path(ns.write).write_text(text)
        print(f"wrote {ns.write} ({len(text)} bytes)", file=sys.stderr)
    elif ns.check:
        path = Path(ns.check)
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is stale: regenerate it with `{COMMAND}`", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
