"""Token shards: a corpus tokenised once into flat token files on disk, for causal-LM training.

A prepared folder holds
- ``tokens-00000.bin`` ...: the token ids of every document, each document followed by the tokenizer's EOS, in
  document order, as raw little-endian ``uint16`` (vocabulary <= 65,536) or ``uint32``; read with ``numpy.memmap``;
- ``documents.bin``: the document-offset index, raw ``int64``: where each document starts in the token stream,
  then the total (documents + 1 entries);
- ``manifest.json``, written LAST (atomically): format, dtype, token and document counts, the tokenizer's and the
  source's fingerprints, and the sha256 of each file. A folder without a manifest is not ready and is never read;
- ``.verified.json``: the record that the files were checked in full against the manifest (checksums, token ids
  within the vocabulary, document offsets increasing), keyed by the manifest and each file's size and mtime: the
  full read happens once per content, not once per run.

This module is the format and its reading (``TokenShards``: the manifest checked against the files, the tokens
memory-mapped). The text comes from ``token_sources``; ``shard_writer`` tokenises it and writes a folder;
``shard_cache`` keeps prepared folders under the datasets cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from leantrain.errors import SourceError
from leantrain.files import sha256_file, sha256_json, write_atomic

FORMAT = "leantrain-token-shards/1"
MANIFEST = "manifest.json"
INDEX = "documents.bin"
VERIFIED = ".verified.json"  # the content check's record (TokenShards.check_contents)

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
        """A ready prepared folder, checked before any token is used (raises SourceError naming the file): the
        manifest's keys, every file's size, the document index's ends; and once per content of the files (recorded
        in ``.verified.json``, redone when a file or the manifest changes): every file's sha256, the token ids
        against the vocabulary, the document offsets increasing."""
        folder = Path(folder)
        where = where or str(folder)
        manifest = read_manifest(folder)
        if manifest is None:
            raise SourceError(f"{where}: no {MANIFEST} (not a prepared folder, or a preparation that did not finish)")
        if not isinstance(manifest, dict):
            raise SourceError(f"{where}: {MANIFEST} is damaged (not valid JSON: truncated or overwritten); prepare "
                              "again")
        if manifest.get("format") != FORMAT:
            raise SourceError(f"{where}: {MANIFEST} has format {manifest.get('format')!r}, expected {FORMAT!r}")
        _check_keys(manifest, where)
        size = np.dtype(manifest["dtype"]).itemsize
        for s in manifest["shards"]:
            f = folder / s["file"]
            if not f.is_file() or f.stat().st_size != s["tokens"] * size:
                raise SourceError(f"{where}: {s['file']} is missing or not {s['tokens']} tokens long; prepare again")
        index = folder / manifest["index"]["file"]
        if not index.is_file() or index.stat().st_size != 8 * manifest["index"]["entries"]:
            raise SourceError(f"{where}: {manifest['index']['file']} is missing or truncated; prepare again")
        shards = cls(folder, manifest)
        ends = (int(shards.doc_starts[0]), int(shards.doc_starts[-1]))
        if ends != (0, shards.n_tokens):
            raise SourceError(f"{where}: {index.name} runs from {ends[0]} to {ends[1]}, not 0 to the {shards.n_tokens} "
                              "tokens of the manifest (damaged); prepare again")
        shards.check_contents(where)
        return shards

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

    def check_contents(self, where: str) -> None:
        """Checksums, token ids and document offsets, read in full once per content of the folder: skipped when
        ``.verified.json`` records the same manifest and the same size and mtime of every file."""
        stamp = content_stamp(self.folder, self.manifest)
        if _read_json(self.folder / VERIFIED) == stamp:
            return
        for name in self.verify():
            raise SourceError(f"{where}: {name} does not match its sha256 in {MANIFEST} (changed or damaged since it "
                              "was prepared); prepare again")
        vocab = int(self.manifest["vocab_size"])
        for s, tokens in zip(self.manifest["shards"], self._maps):
            top = int(tokens.max()) if len(tokens) else 0
            if top >= vocab:
                raise SourceError(f"{where}: {s['file']} holds token id {top}, outside the vocabulary of "
                                  f"{vocab} ({MANIFEST}); prepare again")
        if len(self.doc_starts) > 1 and not bool(np.all(np.diff(self.doc_starts) > 0)):
            raise SourceError(f"{where}: {self.manifest['index']['file']}: document offsets do not increase "
                              "(damaged); prepare again")
        record_verified(self.folder, self.manifest)


def content_stamp(folder: Path, manifest: dict) -> dict:
    """What a content check holds for: the manifest's checksum and each file's size and mtime."""
    files = [s["file"] for s in manifest["shards"]] + [manifest["index"]["file"]]
    stats = {name: [(folder / name).stat().st_size, (folder / name).stat().st_mtime_ns] for name in files}
    return {"manifest": sha256_json(manifest), "files": stats}


def record_verified(folder: Path, manifest: dict) -> None:
    """Record that the files of ``folder`` hold what ``manifest`` says (a folder that cannot be written is checked
    again next time)."""
    try:
        write_atomic(Path(folder) / VERIFIED, json.dumps(content_stamp(Path(folder), manifest)))
    except OSError:
        pass


REQUIRED = {"format": str, "dtype": str, "vocab_size": int, "tokens": int, "documents": int, "shards": list,
            "index": dict, "tokenizer": dict, "source": dict}
FILE_KEYS = {"file": str, "tokens": int, "sha256": str}
INDEX_KEYS = {"file": str, "entries": int, "sha256": str}


def _check_keys(manifest: dict, where: str) -> None:
    """Every key a reader uses, of its type; the counts consistent; file names plain names inside the folder."""
    def need(obj: object, keys: dict, what: str) -> None:
        for key, kind in keys.items():
            if not isinstance(obj, dict) or not isinstance(obj.get(key), kind) or isinstance(obj.get(key), bool):
                raise SourceError(f"{where}: {MANIFEST} lacks {what}{key} (or it is not a {kind.__name__}); it was not "
                                  "written by leantrain prepare, or was edited; prepare again")

    need(manifest, REQUIRED, "")
    for i, entry in enumerate(manifest["shards"]):
        need(entry, FILE_KEYS, f"shards[{i}].")
    need(manifest["index"], INDEX_KEYS, "index.")
    need(manifest["tokenizer"], {"fingerprint": str}, "tokenizer.")
    need(manifest["source"], {"fingerprint": str}, "source.")
    problems = []
    if manifest["dtype"] not in ("uint16", "uint32"):
        problems.append(f"dtype {manifest['dtype']!r} (expected uint16 or uint32)")
    if sum(e["tokens"] for e in manifest["shards"]) != manifest["tokens"] or manifest["tokens"] < 0:
        problems.append(f"tokens {manifest['tokens']} is not the sum of its shards' tokens")
    if manifest["index"]["entries"] != manifest["documents"] + 1:
        problems.append(f"index.entries {manifest['index']['entries']} is not documents + 1 ({manifest['documents']} + 1)")
    names = [e["file"] for e in manifest["shards"]] + [manifest["index"]["file"]]
    problems += [f"file name {n!r} is not a plain name in the folder" for n in names
                 if Path(n).name != n or n in ("", ".", "..")]
    if problems:
        raise SourceError(f"{where}: {MANIFEST} is inconsistent: {'; '.join(problems)}; prepare again")


def read_manifest(folder: Path) -> dict | None:
    """The manifest; None when there is none; ``False`` when it is there but not valid JSON (truncated)."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    parsed = _read_json(path)
    return parsed if isinstance(parsed, dict) else False


def _read_json(path: Path):  # noqa: ANN202
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
