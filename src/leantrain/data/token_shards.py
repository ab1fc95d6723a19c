"""Token shards: a corpus tokenised once into flat token files on disk, for causal-LM training.

A prepared folder holds
- ``tokens-00000.bin`` ...: the token ids of every document, each document followed by the tokenizer's EOS, in
  document order, as raw little-endian ``uint16`` (vocabulary <= 65,536) or ``uint32``; read with ``numpy.memmap``;
- ``documents.bin``: the document-offset index, raw ``int64``: where each document starts in the token stream,
  then the total (documents + 1 entries);
- ``manifest.json``, written LAST (atomically): format, dtype, token and document counts, the tokenizer's and the
  source's fingerprints, and the sha256 of each file. A folder without a manifest is not ready and is never read.

This module is the format and its reading (``TokenShards``: the manifest checked against the files, the tokens
memory-mapped). The text comes from ``token_sources``; ``shard_writer`` tokenises it and writes a folder;
``shard_cache`` keeps prepared folders under the datasets cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from leantrain.data.sources import SourceError
from leantrain.files import sha256_file

FORMAT = "leantrain-token-shards/1"
MANIFEST = "manifest.json"
INDEX = "documents.bin"

class TokenShards:
    """A prepared folder, read-only: the token stream (across shard files) and the document index, memory-mapped."""

    def __init__(self, folder: Path, manifest: dict):
        self.folder = Path(folder)
        self.manifest = manifest
        self.dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
        self.n_tokens = int(manifest["tokens"])
        self.n_documents = int(manifest["documents"])
        self._maps = [np.memmap(self.folder / s["file"], dtype=self.dtype, mode="r") if s["tokens"] else
                      np.zeros(0, self.dtype) for s in manifest["shards"]]
        self._ends = np.cumsum([s["tokens"] for s in manifest["shards"]], dtype=np.int64)
        self.doc_starts = np.memmap(self.folder / manifest["index"]["file"], dtype="<i8", mode="r")

    def __reduce__(self):  # DataLoader workers started by spawn: reopen the files there, never copy the tokens
        return (type(self), (self.folder, self.manifest))

    @classmethod
    def open(cls, folder: str | os.PathLike, *, where: str | None = None) -> "TokenShards":
        """A ready prepared folder (its manifest present and consistent with the files); raises SourceError."""
        folder = Path(folder)
        where = where or str(folder)
        manifest = read_manifest(folder)
        if manifest is None:
            raise SourceError(f"{where}: no {MANIFEST} (not a prepared folder, or a preparation that did not finish)")
        if manifest.get("format") != FORMAT:
            raise SourceError(f"{where}: {MANIFEST} has format {manifest.get('format')!r}, expected {FORMAT!r}")
        size = np.dtype(manifest["dtype"]).itemsize
        for s in manifest["shards"]:
            f = folder / s["file"]
            if not f.is_file() or f.stat().st_size != s["tokens"] * size:
                raise SourceError(f"{where}: {s['file']} is missing or not {s['tokens']} tokens long; prepare again")
        index = folder / manifest["index"]["file"]
        if not index.is_file() or index.stat().st_size != 8 * manifest["index"]["entries"]:
            raise SourceError(f"{where}: {manifest['index']['file']} is missing or truncated; prepare again")
        return cls(folder, manifest)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the stream, as int64 (a copy)."""
        out = np.empty(stop - start, dtype=np.int64)
        pos = start
        k = int(np.searchsorted(self._ends, start, side="right"))
        while pos < stop:
            base = int(self._ends[k - 1]) if k else 0
            end = min(stop, int(self._ends[k]))
            out[pos - start: end - start] = self._maps[k][pos - base: end - base]
            pos, k = end, k + 1
        return out

    def document_starts(self) -> np.ndarray:
        """Where each document starts (documents entries; the final total left out)."""
        return self.doc_starts[:-1]

    def verify(self) -> list[str]:
        """Files whose sha256 differs from the manifest's (reads every byte)."""
        bad = []
        for entry in [*self.manifest["shards"], self.manifest["index"]]:
            if sha256_file(self.folder / entry["file"]) != entry["sha256"]:
                bad.append(entry["file"])
        return bad


def read_manifest(folder: Path) -> dict | None:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None
