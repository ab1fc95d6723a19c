"""File helpers every layer uses: the one sha256 of a file (checkpoints, token shards, converted presets) and of a
JSON-able value (the fingerprints of token-shard sources, tokenizers and cache keys)."""

from __future__ import annotations

import hashlib
import json
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
