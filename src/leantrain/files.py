"""File helpers every layer uses: the one sha256 of a file (checkpoints, token shards, converted presets) and of a
JSON-able value (the fingerprints of token-shard sources, tokenizers and cache keys); a text file written
atomically and durably."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj) -> str:  # noqa: ANN001
    """The hex sha256 of ``obj`` as JSON (keys sorted; what JSON cannot hold written with ``str``)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, rename it over ``path`` and fsync the folder: a
    reader sees the old file or the whole new one, also after a crash."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
