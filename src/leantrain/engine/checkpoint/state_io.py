"""Save and load nested state (optimizer, scheduler, RNG, trainer counters) without pickle.

A state is a tree of dicts, lists, tuples, numbers, strings, None and tensors. Tensors go to a safetensors file,
everything else to a JSON file, where each tensor is replaced by ``{"__tensor__": key}``. Loading reads JSON and
safetensors only: there is no code path that unpickles, and a file that is not valid JSON / safetensors is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

TENSOR = "__tensor__"
TUPLE = "__tuple__"
NDARRAY = "__ndarray__"


class StateFormatError(ValueError):
    """A state file that is not what leantrain writes (corrupt, truncated, or not JSON / safetensors)."""


def _encode(value: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    if isinstance(value, torch.Tensor):
        key = path or "root"
        tensors[key] = value.detach().to("cpu").contiguous().clone()
        return {TENSOR: key}
    if isinstance(value, np.ndarray):
        return {NDARRAY: value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"state key {k!r} at {path or 'root'} is neither str nor int")
            out[str(k) if isinstance(k, str) else f"__int__{k}"] = _encode(v, tensors, f"{path}.{k}" if path else str(k))
        return out
    if isinstance(value, tuple):
        return {TUPLE: [_encode(v, tensors, f"{path}.{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, f"{path}.{i}") for i, v in enumerate(value)]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot save {type(value).__name__} at {path or 'root'} without pickle")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if TENSOR in value:
            return tensors[value[TENSOR]]
        if TUPLE in value:
            return tuple(_decode(v, tensors) for v in value[TUPLE])
        if NDARRAY in value:
            return np.asarray(value[NDARRAY], dtype=value["dtype"])
        return {(int(k[7:]) if k.startswith("__int__") else k): _decode(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    return value


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_state(state: Any, folder: Path, name: str) -> list[Path]:
    """Write ``name.json`` (+ ``name.safetensors`` when there are tensors) into ``folder``, fsynced."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, tensors, "")
    written = []
    if tensors:
        path = folder / f"{name}.safetensors"
        save_file(tensors, str(path))
        written.append(path)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(tree, allow_nan=True))
    written.append(path)
    for p in written:
        fsync_file(p)
    return written


def load_state(folder: Path, name: str) -> Any:
    """Read what ``save_state`` wrote; raises StateFormatError for anything else (never unpickles)."""
    jpath = folder / f"{name}.json"
    try:
        tree = json.loads(jpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StateFormatError(f"{jpath}: not a leantrain JSON state file ({e})") from None
    tpath = folder / f"{name}.safetensors"
    tensors = {}
    if tpath.exists():
        tensors = load_safetensors(tpath)
    try:
        return _decode(tree, tensors)
    except KeyError as e:
        raise StateFormatError(f"{tpath}: tensor {e} named in {jpath.name} is missing") from None


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise StateFormatError(f"{path}: not a valid safetensors file ({e})") from None
