"""The user's own Python named in the config (``grpo.rewards``' ``FILE.py:FUNCTION``, ``grpo.environment``'s
``FILE.py:Class``, or ``module:name``): the module that holds it, loaded once, or a ConfigError naming the key."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from leantrain.errors import ConfigError


def load_module(where: str, key: str, kind: str, form: str):  # noqa: ANN201 - a module
    """The module ``where`` names: a ``.py`` file (registered in ``sys.modules`` as ``leantrain_<kind>_<stem>``, where
    dataclasses and pickle look a class's module up) or an importable module; ``form`` shows the key's shape in the
    error (e.g. ``FILE.py:FUNCTION``)."""
    if not where.endswith(".py"):
        try:
            return importlib.import_module(where)
        except ImportError as e:
            raise ConfigError(f"{key}: cannot import module {where!r} ({e}); a file is written {form}") from e
    file = Path(where).expanduser()
    if not file.is_file():
        raise ConfigError(f"{key}: no file {file} (relative paths are read from {Path.cwd()})")
    name = f"leantrain_{kind}_{file.stem}"
    module_spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ConfigError(f"{key}: {file} fails to load: {type(e).__name__}: {e}") from e
    return module
