"""The cache of prepared token shards: a prepared folder is used as it is (its tokenizer checked); any other
source is prepared once under the datasets cache (``data.cache_dir``) in a folder named by the tokenizer and source
fingerprints: the same tokenizer and source reuse it; a change prepares again. A preparation is written into a
temporary folder renamed into place once its manifest is written, so a killed one is never used."""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

from leantrain.data.caches import default_datasets_cache, record_cache_folder
from leantrain.data.lm.shard_writer import tokenizer_fingerprint, write_shards
from leantrain.errors import SourceError
from leantrain.data.lm.token_shards import FORMAT, TokenShards
from leantrain.data.lm.token_sources import TokenSource
from leantrain.files import sha256_json

log = logging.getLogger("leantrain")

CACHE_FOLDER = "leantrain-token-shards"

def cache_root() -> Path:
    """Where prepared shards are cached: ``<datasets cache>/leantrain-token-shards`` (data.cache_dir)."""
    return default_datasets_cache() / CACHE_FOLDER


def cache_key(source: TokenSource, tokenizer) -> str:  # noqa: ANN001
    return sha256_json({"format": FORMAT, "tokenizer": tokenizer_fingerprint(tokenizer), "source": source.fingerprint})[:24]


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
    if final.exists():
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
        _put_in_place(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    record_cache_folder(final, ", ".join(source.specs))
    return TokenShards.open(final)


def _usable(folder: Path) -> bool:
    try:
        TokenShards.open(folder)
        return True
    except SourceError:
        return False


def _put_in_place(tmp: Path, final: Path) -> None:
    """Rename the new preparation ``tmp`` to ``final``. A ``final`` already there is kept when it is usable (another
    process prepared it first), else (half-written, damaged) moved aside and replaced: no moment without a folder
    that is either the old one or the complete new one, and a kill mid-way leaves the old one in a folder
    ``_remove_stale`` clears."""
    for _ in range(3):
        try:
            os.replace(tmp, final)
            return
        except OSError:
            if _usable(final):
                return
        aside = final.with_name(f"{final.name}.tmp-{os.getpid()}-old{uuid.uuid4().hex[:6]}")
        try:
            os.replace(final, aside)
        except FileNotFoundError:  # another process moved it aside first: try again
            continue
        shutil.rmtree(aside, ignore_errors=True)
    raise SourceError(f"{final}: could not replace the damaged preparation there; remove it (leantrain cache "
                      "--clear) and run again")


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
