"""Token shards: a corpus tokenised once into flat token files on disk, for causal-LM training.

A prepared folder holds
- ``tokens-00000.bin`` ...: the token ids of every document, each document followed by the tokenizer's EOS, in
  document order, as raw little-endian ``uint16`` (vocabulary <= 65,536) or ``uint32``; read with ``numpy.memmap``;
- ``documents.bin``: the document-offset index, raw ``int64``: where each document starts in the token stream,
  then the total (documents + 1 entries);
- ``manifest.json``, written LAST (atomically): format, dtype, token and document counts, the tokenizer's and the
  source's fingerprints, and the sha256 of each file. A folder without a manifest is not ready and is never read.

Preparation streams its input (batches of documents; memory does not grow with the corpus) and tokenises in a
pool of processes (``num_proc``), the results written in document order, so the shards are the same whatever the
number of processes. Prepared data is cached under the datasets cache (``data.cache_dir``) in a folder named by
the tokenizer and source fingerprints: the same tokenizer and source reuse it; a change prepares again.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
import sys
import time
import uuid
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from leantrain.data.caches import default_datasets_cache, record_cache_folder
from leantrain.data.sources import SourceError, open_source, pick_split
from leantrain.files import sha256_file

log = logging.getLogger("leantrain")

FORMAT = "leantrain-token-shards/1"
MANIFEST = "manifest.json"
INDEX = "documents.bin"
CACHE_FOLDER = "leantrain-token-shards"
TEXT_SUFFIXES = (".txt", ".text")
SHARD_TOKENS = 1 << 28  # tokens per shard file (512 MiB as uint16)
BATCH_DOCS = 1000  # documents per tokenisation task ...
BATCH_CHARS = 4 << 20  # ... or this many characters, whichever comes first
READ_CHARS = 1 << 20  # .txt files with a document separator are read in pieces of this size
AUTO_PARALLEL_BYTES = 16 << 20  # num_proc unset: one process below this corpus size


# ----------------------------------------------------------------------------------------------- sources


@dataclass
class TokenSource:
    """Where a causal LM's text comes from: .txt files, one tabular/JSON source with a text column, or a prepared
    folder (``manifest.json``). ``documents()`` streams the texts; ``fingerprint`` names the content."""

    key: str  # config key in messages ("data.train")
    specs: list[str]  # what the user wrote
    kind: str  # txt | table | prepared
    files: list[Path] = field(default_factory=list)  # txt: the files, in order
    separator: str | None = None  # txt: split files into documents here; None = one document per file
    dataset: object | None = None  # table: the datasets.Dataset (Arrow, memory-mapped)
    text_column: str | None = None  # table: the column read
    folder: Path | None = None  # prepared: the folder
    fingerprint: str = ""

    @property
    def where(self) -> str:
        return f"{self.key}: {', '.join(self.specs)}"

    def describe(self) -> dict:
        return {"specs": self.specs, "kind": self.kind, "text_column": self.text_column,
                "document_separator": self.separator, "fingerprint": self.fingerprint}

    def documents(self) -> Iterator[str]:
        """Every document's text in order (blank ones included; the writer skips them)."""
        if self.kind == "txt":
            for path in self.files:
                yield from _file_documents(path, self.separator, self.key)
        elif self.kind == "table":
            ds = self.dataset.select_columns([self.text_column])
            for batch in ds.iter(batch_size=BATCH_DOCS):
                yield from (t if isinstance(t, str) else "" for t in batch[self.text_column])
        else:
            raise ValueError("a prepared folder has no documents to read")

    def size_bytes(self) -> int:
        if self.kind == "txt":
            return sum(p.stat().st_size for p in self.files)
        if self.kind == "table":
            return int(getattr(self.dataset, "data").nbytes) if self.dataset is not None else 0
        return 0


def _file_documents(path: Path, separator: str | None, key: str = "data.train") -> Iterator[str]:
    try:
        with open(path, encoding="utf-8", errors="strict", newline="") as f:
            if separator is None:
                yield f.read()
                return
            rest = ""
            while True:
                piece = f.read(READ_CHARS)
                if not piece:
                    break
                parts = (rest + piece).split(separator)
                rest = parts.pop()
                yield from parts
            yield rest
    except UnicodeDecodeError as e:
        raise SourceError(f"{key}: {path}: not UTF-8 text ({e.reason}: byte {e.object[e.start:e.start + 1]!r}); "
                          "convert it to UTF-8") from None


def _is_glob(spec: str) -> bool:
    return any(c in spec for c in "*?[")


def open_token_source(specs: str | Iterable[str], key: str, *, text_column: str | None = None,
                      separator: str | None = None, split: str | None = "train", quoting: str = "auto",
                      eval_split: bool = False) -> TokenSource:
    """Resolve the sources of one split (``data.train`` or ``data.eval``; ``leantrain prepare``'s arguments).
    A multi-split tabular source gives ``split`` (eval: ``split``, else validation, else test). Raises SourceError
    naming the key and file."""
    specs = [specs] if isinstance(specs, str) else list(specs)
    if not specs:
        raise SourceError(f"{key}: no source given")
    texts: list[Path] = []
    others: list[str] = []
    for spec in specs:
        path = Path(spec).expanduser()
        if _is_glob(spec) and not path.exists():
            found = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
            if not found:
                raise SourceError(f"{key}: {spec} matches no file")
            for p in found:
                (texts.append(p) if p.suffix.lower() in TEXT_SUFFIXES else others.append(str(p)))
        elif path.is_dir() and (path / MANIFEST).is_file():
            if len(specs) > 1:
                raise SourceError(f"{key}: {spec} is a prepared folder; give it alone")
            shards = TokenShards.open(path, where=f"{key}: {spec}")
            return TokenSource(key, specs, "prepared", folder=path, fingerprint=shards.manifest["source"]["fingerprint"])
        elif path.is_dir() and ((path / INDEX).exists() or any(path.glob("tokens-*.bin"))):
            raise SourceError(f"{key}: {spec} holds token shards but no {MANIFEST}: a preparation that did not "
                              "finish (killed?); run leantrain prepare again")
        elif path.is_dir() and sorted(path.glob("*.txt")):
            texts += sorted(path.glob("*.txt"))
        elif path.suffix.lower() in TEXT_SUFFIXES:
            if not path.is_file():
                raise SourceError(f"{key}: file not found: {path}")
            texts.append(path)
        else:
            others.append(spec)
    if texts and others:
        raise SourceError(f"{key}: mixes .txt files with other sources ({', '.join(others[:3])}); use one kind")
    if len(others) > 1:
        raise SourceError(f"{key}: several tabular sources ({', '.join(others[:3])}); give one (or .txt files)")
    if texts:
        separator = unescape_separator(separator)
        if separator == "":
            raise SourceError("data.document_separator: an empty separator; unset it for one document per file")
        stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in texts]
        fp = _sha({"kind": "txt", "files": stats, "separator": separator})
        return TokenSource(key, specs, "txt", files=texts, separator=separator, fingerprint=fp)
    source = open_source(others[0], key, quoting=quoting)
    if eval_split:
        wanted, setting = ([split], "data.eval_split") if split else (["validation", "test"], None)
    else:
        wanted, setting = [split], "data.train_split"
    part = pick_split(source, wanted, setting=setting, single_ok=eval_split)
    if part is None:
        raise SourceError(f"{key}: {others[0]} has several splits ({', '.join(source.data)}) and none is named "
                          "validation or test; set data.eval_split")
    ds = part.ds
    column = _text_column(ds, text_column, part.where)
    if source.path is not None and source.path.is_file():
        st = source.path.stat()
        content = [str(source.path.resolve()), st.st_size, st.st_mtime_ns]
    else:
        content = [others[0], getattr(ds, "_fingerprint", None)]
    fp = _sha({"kind": "table", "source": content, "split": part.split, "column": column})
    return TokenSource(key, specs, "table", dataset=ds, text_column=column, fingerprint=fp)


def unescape_separator(separator: str | None) -> str | None:
    """``\\n``, ``\\t``, ``\\r`` written on a command line (data.document_separator='\\n\\n') mean the characters."""
    if separator is None or "\\" not in separator:
        return separator
    return separator.replace("\\n", "\n").replace("\\t", "\t").replace("\\r", "\r")


def _text_column(ds, wanted: str | None, where: str) -> str:  # noqa: ANN001
    import datasets

    strings = [c for c, f in ds.features.items() if isinstance(f, datasets.Value) and f.dtype in ("string", "large_string")]
    if wanted is not None:
        if wanted not in ds.column_names:
            raise SourceError(f"{where}: no column {wanted!r} (data.text_column); columns: {', '.join(ds.column_names)}")
        if wanted not in strings:
            raise SourceError(f"{where}: column {wanted!r} (data.text_column) holds {ds.features[wanted]}, not text")
        return wanted
    if "text" in strings:
        return "text"
    if len(strings) == 1:
        return strings[0]
    raise SourceError(f"{where}: set data.text_column to the column holding the documents (text columns: "
                      f"{', '.join(strings) or 'none'}; columns: {', '.join(ds.column_names)})")


# ----------------------------------------------------------------------------------------------- tokenizer


def tokenizer_fingerprint(tokenizer) -> str:  # noqa: ANN001
    """What decides the token ids: the tokenizer's model, normaliser, pre-tokenizer and added tokens (fast
    tokenizers), else its vocabulary; plus the BOS/EOS the documents get. Not the pad token or chat template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        core = {k: spec.get(k) for k in ("model", "normalizer", "pre_tokenizer", "added_tokens")}
    else:
        core = {"vocab": sorted(tokenizer.get_vocab().items())}
    return _sha({"core": core, "framing": document_framing(tokenizer), "size": len(tokenizer)})


def document_framing(tokenizer) -> dict:  # noqa: ANN001
    """The ids around each document: the BOS the tokenizer adds itself (None when it adds none) and the EOS."""
    eos = tokenizer.eos_token_id
    bos = tokenizer.bos_token_id
    adds_bos = False
    if bos is not None:
        with_special = tokenizer("a")["input_ids"]
        adds_bos = bool(with_special) and with_special[0] == bos and tokenizer("a", add_special_tokens=False)[
            "input_ids"][:1] != [bos]
    return {"bos": bos if adds_bos else None, "eos": eos}


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocabulary <= 65,536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


# ----------------------------------------------------------------------------------------------- tokenising

_WORKER: dict = {}


def _init_worker(tokenizer, framing: dict, dtype: str) -> None:  # noqa: ANN001
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _WORKER.update(tokenizer=tokenizer, framing=framing, dtype=dtype)


def encode_documents(texts: list[str], tokenizer, framing: dict, dtype) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """A batch of documents -> (their tokens back to back, each framed by [BOS] ... EOS, as ``dtype``; the length
    of each). One flat array per batch: little to pass between processes and nothing per document to collect."""
    ids = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    lead = [] if framing["bos"] is None else [framing["bos"]]
    end = [framing["eos"]]
    lengths = np.fromiter((len(x) + len(lead) + 1 for x in ids), dtype=np.int64, count=len(ids))
    flat: list[int] = []
    for x in ids:
        flat += lead
        flat += x
        flat += end
    return np.array(flat, dtype=dtype), lengths


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return encode_documents(texts, _WORKER["tokenizer"], _WORKER["framing"], _WORKER["dtype"])


def _batches(docs: Iterable[str], skipped: list[int]) -> Iterator[list[str]]:
    batch: list[str] = []
    chars = 0
    for text in docs:
        if not text or text.isspace():
            skipped[0] += 1
            continue
        batch.append(text)
        chars += len(text)
        if len(batch) >= BATCH_DOCS or chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _encoded(batches: Iterator[list[str]], tokenizer, framing: dict, dtype: str,  # noqa: ANN001
             num_proc: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Encoded batches in input order; with num_proc > 1 a process pool with at most 2 x num_proc batches in flight
    (bounded memory: the input is read no faster than it is tokenised)."""
    if num_proc <= 1:
        for batch in batches:
            yield encode_documents(batch, tokenizer, framing, dtype)
        return
    with ProcessPoolExecutor(num_proc, mp_context=get_context("spawn"), initializer=_init_worker,
                             initargs=(tokenizer, framing, dtype)) as pool:
        window: deque = deque()
        for batch in batches:
            window.append(pool.submit(_encode_in_worker, batch))
            if len(window) >= 2 * num_proc:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


class _Writer:
    """Appends documents to token shards and the document index, hashing as it writes."""

    def __init__(self, folder: Path, dtype: np.dtype, shard_tokens: int):
        self.folder, self.dtype, self.shard_tokens = folder, dtype, shard_tokens
        self.shards: list[dict] = []
        self.tokens = 0
        self.documents = 0
        self.lengths = _LengthSketch()
        self._file = None
        self._hash = None
        self._in_shard = 0
        self._index = open(folder / INDEX, "wb")
        self._index_hash = hashlib.sha256()

    def _open_shard(self) -> None:
        name = f"tokens-{len(self.shards):05d}.bin"
        self._file = open(self.folder / name, "wb")
        self._hash = hashlib.sha256()
        self._in_shard = 0
        self.shards.append({"file": name, "tokens": 0, "sha256": ""})

    def _close_shard(self) -> None:
        if self._file is not None:
            self._file.close()
            self.shards[-1].update(tokens=self._in_shard, sha256=self._hash.hexdigest())
            self._file = None

    def _write_index(self, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values, dtype="<i8").tobytes()
        self._index.write(data)
        self._index_hash.update(data)

    def add(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        """Documents given back to back (``flat``, already this writer's dtype) with their ``lengths``."""
        if not len(lengths):
            return
        self._write_index(self.tokens + np.concatenate([[0], np.cumsum(lengths)[:-1]]))
        self.lengths.add(lengths)
        flat = np.asarray(flat, dtype=self.dtype.newbyteorder("<"))
        while len(flat):
            if self._file is None or self._in_shard >= self.shard_tokens:
                self._close_shard()
                self._open_shard()
            take = flat[: self.shard_tokens - self._in_shard]
            data = take.tobytes()
            self._file.write(data)
            self._hash.update(data)
            self._in_shard += len(take)
            flat = flat[len(take):]
        self.tokens += int(lengths.sum())
        self.documents += len(lengths)

    def close(self) -> dict:
        self._close_shard()
        self._write_index(np.array([self.tokens]))
        self._index.close()
        return {"shards": self.shards, "index": {"file": INDEX, "dtype": "int64", "entries": self.documents + 1,
                                                 "sha256": self._index_hash.hexdigest()}}


class _LengthSketch:
    """Tokens per document: exact min/max/mean, and quantiles from a bounded histogram (log-spaced bins)."""

    BINS = np.unique(np.round(np.logspace(0, 10, 2000)).astype(np.int64))

    def __init__(self):
        self.counts = np.zeros(len(self.BINS) + 1, dtype=np.int64)
        self.min = None
        self.max = 0
        self.sum = 0

    def add(self, lengths: np.ndarray) -> None:
        self.counts += np.bincount(np.searchsorted(self.BINS, lengths, side="left"), minlength=len(self.counts))
        lo = int(lengths.min())
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = max(self.max, int(lengths.max()))
        self.sum += int(lengths.sum())

    def quantile(self, q: float) -> int:
        total = int(self.counts.sum())
        if not total:
            return 0
        i = int(np.searchsorted(np.cumsum(self.counts), q * total, side="left"))
        return int(self.BINS[min(i, len(self.BINS) - 1)])

    def summary(self) -> dict:
        n = int(self.counts.sum())
        if not n:
            return {"min": 0, "median": 0, "p90": 0, "max": 0, "mean": 0.0}
        return {"min": self.min, "median": min(max(self.quantile(0.5), self.min), self.max),
                "p90": min(max(self.quantile(0.9), self.min), self.max), "max": self.max, "mean": self.sum / n}


# ----------------------------------------------------------------------------------------------- reading


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


def _sha(obj) -> str:  # noqa: ANN001
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


# ----------------------------------------------------------------------------------------------- preparing


def auto_num_proc(corpus_bytes: int) -> int:
    """data.num_proc unset: one worker per CPU but one (the main process reads, writes and hashes), at most 8, for
    corpora over 16 MB; else 1 (no pool: in-process, where a fast tokenizer still spreads a batch over threads)."""
    workers = min(8, (os.cpu_count() or 1) - 1)
    return workers if corpus_bytes > AUTO_PARALLEL_BYTES and workers >= 2 else 1


def write_shards(source: TokenSource, tokenizer, folder: Path, *, num_proc: int | None = None,  # noqa: ANN001
                 desc: str = "Tokenizing", shard_tokens: int = SHARD_TOKENS) -> dict:
    """Tokenise ``source`` into ``folder`` (created; old shard files and manifest there are replaced), writing the
    manifest last. Returns the manifest."""
    framing = document_framing(tokenizer)
    if framing["eos"] is None:
        raise SourceError(f"{source.where}: the tokenizer has no EOS token to end documents with; give a tokenizer "
                          "with an eos_token")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)  # not ready from here on, until the new manifest lands
    for old in folder.glob("tokens-*.bin"):
        old.unlink()
    procs = num_proc or auto_num_proc(source.size_bytes())
    dtype = token_dtype(len(tokenizer))
    writer = _Writer(folder, dtype, shard_tokens)
    skipped = [0]
    start = time.perf_counter()
    bar = _progress(desc, source)
    try:
        for flat, lengths in _encoded(_batches(source.documents(), skipped), tokenizer, framing, dtype.str, procs):
            writer.add(flat, lengths)
            bar.update(len(flat))
    finally:
        bar.close()
    files = writer.close()
    seconds = time.perf_counter() - start
    manifest = {
        "format": FORMAT, "dtype": dtype.name, "vocab_size": len(tokenizer), "tokens": writer.tokens,
        "documents": writer.documents, "skipped_blank_documents": skipped[0], **files,
        "tokens_per_document": writer.lengths.summary(),
        "tokenizer": {"fingerprint": tokenizer_fingerprint(tokenizer), "name": getattr(tokenizer, "name_or_path", ""),
                      "class": type(tokenizer).__name__, **framing},
        "source": source.describe(),
        "prepared": {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "seconds": round(seconds, 3),
                     "num_proc": procs},
    }
    _write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1))
    log.info("%s: %s tokens in %s documents (%s), %.1f s, %.0f tokens/s", desc, f"{writer.tokens:,}",
             f"{writer.documents:,}", dtype.name, seconds, writer.tokens / max(seconds, 1e-9))
    return manifest


def _progress(desc: str, source: TokenSource):  # noqa: ANN001
    from tqdm.auto import tqdm

    return tqdm(desc=desc, unit="tok", unit_scale=True, disable=None, file=sys.stderr, leave=False)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def cache_root() -> Path:
    """Where prepared shards are cached: ``<datasets cache>/leantrain-token-shards`` (data.cache_dir)."""
    return default_datasets_cache() / CACHE_FOLDER


def cache_key(source: TokenSource, tokenizer) -> str:  # noqa: ANN001
    return _sha({"format": FORMAT, "tokenizer": tokenizer_fingerprint(tokenizer), "source": source.fingerprint})[:24]


def prepared_shards(source: TokenSource, tokenizer, *, num_proc: int | None = None,  # noqa: ANN001
                    desc: str = "Tokenizing") -> TokenShards:
    """The token shards of ``source`` with ``tokenizer``: a prepared folder as it is (its tokenizer checked), else
    the cached preparation when there is one, else prepared now into the cache (in a temporary folder renamed into
    place once its manifest is written: a killed preparation is never used)."""
    if source.kind == "prepared":
        shards = TokenShards.open(source.folder, where=source.where)
        theirs, ours = shards.manifest["tokenizer"]["fingerprint"], tokenizer_fingerprint(tokenizer)
        if theirs != ours:
            raise SourceError(f"{source.where}: prepared with another tokenizer ({shards.manifest['tokenizer']['name']!r},"
                              f" fingerprint {theirs[:12]}) than this run's ({getattr(tokenizer, 'name_or_path', '')!r},"
                              f" {ours[:12]}); prepare it again with this tokenizer (leantrain prepare)")
        return shards
    root = cache_root()
    final = root / cache_key(source, tokenizer)
    if read_manifest(final) is not None:
        try:
            shards = TokenShards.open(final)
            log.info("%s: reusing the token shards in %s", source.where, final)
            return shards
        except SourceError as e:
            log.warning("warning: %s; preparing again", e)
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale(root, final.name)
    tmp = root / f"{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        write_shards(source, tokenizer, tmp, num_proc=num_proc, desc=desc)
        if final.exists() and read_manifest(final) is None:  # half-written (killed) or failed its check: replace
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError:  # another process got there first
            if read_manifest(final) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    record_cache_folder(final, ", ".join(source.specs))
    return TokenShards.open(final)


def _remove_stale(root: Path, name: str) -> None:
    """Temporary folders of killed preparations of the same key (their process is gone)."""
    for tmp in root.glob(f"{name}.tmp-*"):
        try:
            pid = int(tmp.name.split(".tmp-")[1].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, IndexError, PermissionError, OSError):
            continue
