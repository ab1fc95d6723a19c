"""The rows of a multi-turn run as prompts: each row's opening messages from its environment's ``reset(row)`` (its
``prompt`` column, the other columns kept for the reward functions and the episode) and the environment's tool schemas
as its ``tools`` column (rendered for the chat template, or into the system message: ``data.lm.prompts``), the row as
read in ``episode_row`` (JSON). Done once
when the data is prepared, so the prompts are rendered, cut, checked and cached as any prompt is; an episode calls
``reset`` again on its own instance (``episodes``), so ``reset`` must be a function of the row."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import sys

from leantrain.data.sources import Part
from leantrain.data.text_loader import data_error
from leantrain.environments import schemas

PROMPT, TOOLS = "prompt", "tools"
ROW = "episode_row"  # the row as it was read (JSON): what each episode's reset is given again


def opening(environment: type, part: Part) -> Part:
    """``part`` with each row's ``prompt`` set to ``environment().reset(row)`` and ``tools`` to its schemas (JSON);
    a row whose reset raises or returns no list of messages is a DataError naming the file, the row and the
    environment."""
    tools = json.dumps(schemas(environment)) if environment.tools else None
    name = environment.__name__
    extra = {TOOLS: tools} if tools else {}  # no column of nulls for an environment without tools
    problems: list[str] = []

    def opened(row: dict, i: int) -> dict:
        try:
            messages = environment().reset(dict(row))
        except Exception as e:  # the user's code: named, with its row
            problems.append(f"{part.where}: {part.rows([i])}: {name}.reset failed: {type(e).__name__}: {e}")
            return {PROMPT: [], ROW: "{}", **extra}
        if not (isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)):
            problems.append(f"{part.where}: {part.rows([i])}: {name}.reset returned {type(messages).__name__} "
                            f"{str(messages)[:80]!r}, not a list of {{role, content}} messages")
            return {PROMPT: [], ROW: "{}", **extra}
        return {PROMPT: [{"role": str(m.get("role")), "content": str(m.get("content"))} for m in messages],
                ROW: json.dumps(dict(row), default=str), **extra}

    drop = [c for c in (PROMPT, TOOLS, ROW) if c in part.ds.column_names]
    ds = part.ds.map(opened, with_indices=True, remove_columns=drop, load_from_cache_file=False,
                     new_fingerprint=fingerprint(part.ds, environment), desc=f"Opening episodes ({name}.reset)")
    if problems:
        raise data_error(problems[:10])
    return dataclasses.replace(part, ds=ds)


def fingerprint(ds, environment: type) -> str:  # noqa: ANN001 - a datasets.Dataset
    """The opened rows' fingerprint: the rows' and the environment's (its class and its file's text), so that a resumed
    run sees the same data and a changed environment is new data."""
    try:
        source = inspect.getsource(sys.modules[environment.__module__])
    except (OSError, TypeError, KeyError):
        source = ""
    text = f"{ds._fingerprint}:{environment.__module__}.{environment.__qualname__}:{source}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]

