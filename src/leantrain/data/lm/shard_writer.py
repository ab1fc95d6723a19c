"""Tokenising a corpus into token shards (the folder format is ``token_shards``'s): the ids a tokenizer gives a
document and its fingerprint, the tokenisation (in-process or in a pool), and the writer of the shard files, the
document index and, last, the manifest.

Preparation streams its input (batches of documents; memory does not grow with the corpus) and tokenises in a
pool of processes (``num_proc``), the results written in document order, so the shards are the same whatever the
number of processes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np

from leantrain.errors import SourceError
from leantrain.data.lm.token_shards import FORMAT, INDEX, MANIFEST, record_verified
from leantrain.files import disk_full, disk_of, sha256_json, write_atomic
from leantrain.processes import bind_to_parent

if TYPE_CHECKING:
    from leantrain.data.lm.token_sources import TokenSource

log = logging.getLogger("leantrain")

SHARD_TOKENS = 1 << 28  # tokens per shard file (512 MiB as uint16)
BATCH_DOCS = 1000  # documents per tokenisation task ...
BATCH_CHARS = 4 << 20  # ... or this many characters, whichever comes first
AUTO_PARALLEL_BYTES = 16 << 20  # num_proc unset: one process below this corpus size

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
    return sha256_json({"core": core, "framing": document_framing(tokenizer), "size": len(tokenizer)})


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
    """A tokenising process: killed with the command (SIGKILL, SIGTERM: ``prctl`` death signal); deaf to a terminal's
    Ctrl-C, which the command handles (it stops the pool)."""
    bind_to_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by _interrupts_held at its start
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
    pool = ProcessPoolExecutor(num_proc, mp_context=get_context("spawn"), initializer=_init_worker,
                               initargs=(tokenizer, framing, dtype))
    try:
        window: deque = deque()
        for batch in batches:
            with _interrupts_held():
                window.append(pool.submit(_encode_in_worker, batch))
            if len(window) >= 2 * num_proc:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()
    except BaseException:  # Ctrl-C, an error, the consumer gone: stop the workers now, not after their batches
        _stop(pool)
        raise
    pool.shutdown(wait=True)


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """SIGINT held back while the pool may start a process: the process starts with it blocked (its initializer
    then ignores it), and this one gets it right after, as a KeyboardInterrupt."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _stop(pool: ProcessPoolExecutor) -> None:
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.kill()
    for worker in workers:
        worker.join()


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

    def abandon(self) -> None:
        """Close the files without finishing them (a failed preparation)."""
        for f in (self._file, self._index):
            if f is not None and not f.closed:
                try:
                    f.close()
                except OSError:  # the buffered tail could not be written: nothing to keep anyway
                    pass

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
    try:
        return _write(source, tokenizer, folder, framing, dtype, procs, desc, shard_tokens)
    except OSError as e:
        if not disk_full(e):
            raise
        for written in [*folder.glob("tokens-*.bin"), folder / INDEX]:
            written.unlink(missing_ok=True)
        raise SourceError(f"{source.where}: disk full while writing the token shards to {folder}; the partial shards "
                          f"were removed; free some space on {disk_of(folder)} and run again") from None


def _write(source: TokenSource, tokenizer, folder: Path, framing: dict, dtype: np.dtype, procs: int,  # noqa: ANN001
           desc: str, shard_tokens: int) -> dict:
    writer = _Writer(folder, dtype, shard_tokens)
    skipped = [0]
    start = time.perf_counter()
    bar = _progress(desc, source)
    try:
        for flat, lengths in _encoded(_batches(source.documents(), skipped), tokenizer, framing, dtype.str, procs):
            writer.add(flat, lengths)
            bar.update(len(flat))
    except BaseException:
        writer.abandon()
        raise
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
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1))
    record_verified(folder, manifest)  # what was just written and hashed: no need to read it again
    log.info("%s: %s tokens in %s documents (%s), %.1f s, %.0f tokens/s", desc, f"{writer.tokens:,}",
             f"{writer.documents:,}", dtype.name, seconds, writer.tokens / max(seconds, 1e-9))
    return manifest


def _progress(desc: str, source: TokenSource):  # noqa: ANN001
    from tqdm.auto import tqdm

    return tqdm(desc=desc, unit="tok", unit_scale=True, disable=None, file=sys.stderr, leave=False)
