"""Caches outside the run folder: where they are, what they hold, ``leantrain cache --list`` / ``--clear``.

Two places (docs/caches.md):

- the ``datasets`` cache: ``data.cache_dir``, else ``$HF_DATASETS_CACHE``, else ``~/.cache/huggingface/datasets``
  (datasets' own default, shared with every other ``datasets`` user on the machine). ``datasets.load_dataset``
  keeps an Arrow copy of each data file there, and the processed (tokenised) datasets are cached beside it.
  leantrain records each such folder it loads into, so that ``--list`` and ``--clear`` touch only those;
- leantrain's own cache: ``$LEANTRAIN_CACHE``, else ``~/.cache/leantrain`` (the built-in demo data, the measured
  ``peak_flops.json``, and the record of the datasets folders above);
- values computed once per model and data before training (the preference task's reference log-probs,
  ``leantrain.engine.setup.precompute``): a ``leantrain-precomputed`` folder beside the processed data (inside a datasets
  cache folder above, else in the datasets cache's root), listed and cleared as entries of their own.

Both are safe to delete: everything in them is rebuilt on the next run that needs it.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

from leantrain.files import write_atomic
from leantrain.units import format_bytes

RECORD = "datasets-caches.jsonl"
PRECOMPUTED = "leantrain-precomputed"  # a folder of per-row values computed before training, beside the data
_CACHE_DIR: ContextVar[str | None] = ContextVar("leantrain_datasets_cache_dir", default=None)


def leantrain_cache_dir() -> Path:
    return Path(os.environ.get("LEANTRAIN_CACHE") or Path.home() / ".cache" / "leantrain")


def write_splits(out_dir: str | os.PathLike, splits) -> tuple[Path, Path]:  # noqa: ANN001 - (train rows, eval rows)
    """A built-in prompt set's (train, eval) rows written as ``out_dir``/train.jsonl and eval.jsonl, overwriting,
    each file whole (``write_atomic``); their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.jsonl", out / "eval.jsonl"
    for path, rows in zip(paths, splits):
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    return paths


def cached_splits(folder: str, build) -> tuple[Path, Path]:  # noqa: ANN001 - () -> (train rows, eval rows)
    """train.jsonl and eval.jsonl of a built-in prompt set, written once into leantrain's cache (``folder``, its
    version in the name). Safe when several processes call it at once: each file appears whole and every writer
    writes the same bytes."""
    out = leantrain_cache_dir() / folder
    paths = out / "train.jsonl", out / "eval.jsonl"
    return paths if all(p.is_file() for p in paths) else write_splits(out, build())


def datasets_cache_dir() -> str | None:
    """The ``cache_dir`` to pass to ``datasets.load_dataset``: ``data.cache_dir`` of the run being set up, or None
    (datasets' default)."""
    return _CACHE_DIR.get()


def default_datasets_cache() -> Path:
    import datasets

    return Path(_CACHE_DIR.get() or datasets.config.HF_DATASETS_CACHE)


@contextmanager
def using_cache_dir(path: str | os.PathLike | None) -> Iterator[None]:
    """Within this block, datasets loaded by leantrain keep their caches under ``path`` (None: datasets' default)."""
    token = _CACHE_DIR.set(str(Path(path).expanduser()) if path else None)
    try:
        yield
    finally:
        _CACHE_DIR.reset(token)


def record_dataset_cache(dataset, spec: str) -> None:
    """Remember the cache folder(s) of a dataset leantrain loaded (one JSON line each, appended: several processes
    may write; duplicates are merged when read). Never fails the run."""
    try:
        files = dataset.cache_files
        if isinstance(files, dict):  # a DatasetDict: per split
            files = [f for split in files.values() for f in split]
        folders = sorted({str(Path(f["filename"]).parent) for f in files})
        record_cache_folder(folders, spec)
    except Exception:  # noqa: BLE001 - bookkeeping only
        pass


def record_cache_folder(folders: str | os.PathLike | list, spec: str) -> None:
    """Remember cache folder(s) leantrain wrote or loaded into (``--list`` / ``--clear`` touch only those); one
    JSON line each, appended (several processes may write). Never fails the run."""
    try:
        folders = [str(f) for f in folders] if isinstance(folders, list) else [str(folders)]
        if not folders:
            return
        base = leantrain_cache_dir()
        base.mkdir(parents=True, exist_ok=True)
        record = base / RECORD
        known = record.read_text(errors="replace") if record.is_file() else ""
        wanted = [json.dumps({"path": d, "source": absolute_sources(spec)}) for d in folders]
        text = "".join(e + "\n" for e in wanted if e not in known)  # each folder and source once
        if not text:
            return
        fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except Exception:  # noqa: BLE001 - bookkeeping only
        pass


def absolute_sources(spec: str | os.PathLike) -> str:
    """A data spec as ``--list`` shows it from any folder: each local path (or glob) of a comma-joined list made
    absolute; a Hub name stays as it is."""
    parts = str(spec).split(", ")
    return ", ".join(os.path.abspath(p) if Path(p).exists() or any(c in p for c in "*?[") else p for p in parts)


def size_of(path: Path, skip: str | None = None) -> int:
    """Bytes of a file or of the files under a folder (leaving out sub-folders named ``skip``)."""
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != skip]
        for name in files:
            try:
                total += (Path(root) / name).lstat().st_size
            except OSError:
                pass
    return total


def recorded_dataset_caches() -> list[dict]:
    """Datasets cache folders leantrain loaded (or wrote precomputed values) into that still exist: ``{"path",
    "sources", "bytes"}``; a datasets folder's bytes leave out the precomputed folder inside it (its own entry)."""
    record = leantrain_cache_dir() / RECORD
    found: dict[str, set[str]] = {}
    if record.is_file():
        for line in record.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            found.setdefault(entry.get("path", ""), set()).add(entry.get("source", ""))
    for p in list(found):  # precomputed values beside the processed data of a recorded folder
        if (Path(p) / PRECOMPUTED).is_dir():
            found.setdefault(str(Path(p) / PRECOMPUTED), set())
    return [{"path": p, "sources": sorted(s - {""}), "bytes": size_of(Path(p), skip=PRECOMPUTED)}
            for p, s in sorted(found.items()) if p and Path(p).is_dir()]


def entries() -> list[dict]:
    """Everything ``--list`` shows: leantrain's own cache entries, then the recorded datasets cache folders and the
    precomputed values."""
    own = leantrain_cache_dir()
    rows = [{"kind": "leantrain", "path": str(p), "bytes": size_of(p)}
            for p in sorted(own.iterdir())] if own.is_dir() else []
    rows += [{"kind": "precomputed" if Path(e["path"]).name == PRECOMPUTED else "datasets", "path": e["path"],
              "bytes": e["bytes"], "sources": e["sources"]} for e in recorded_dataset_caches()]
    return rows


def list_caches(echo=print) -> list[dict]:
    rows = entries()
    echo(f"leantrain cache: {leantrain_cache_dir()} ($LEANTRAIN_CACHE)")
    echo(f"datasets cache:  {default_datasets_cache()} (data.cache_dir, else $HF_DATASETS_CACHE); "
         "folders leantrain loaded into:")
    for r in rows:
        extra = f"  <- {', '.join(r['sources'])}" if r.get("sources") else ""
        echo(f"  {format_bytes(r['bytes']):>10}  {r['kind']:<11} {r['path']}{extra}")
    echo(f"  {format_bytes(sum(r['bytes'] for r in rows)):>10}  total ({len(rows)} entr{'y' if len(rows) == 1 else 'ies'})")
    return rows


def clear_caches(echo=print) -> list[dict]:
    """Remove the precomputed values, the recorded datasets cache folders (and the empty folders above them) and
    leantrain's own cache; print each removal. Returns what was removed."""
    removed = []
    for r in sorted(entries(), key=lambda r: r["kind"] != "precomputed"):  # the folders inside others first
        if r["kind"] == "leantrain":
            continue
        path = Path(r["path"])
        shutil.rmtree(path, ignore_errors=True)
        if r["kind"] == "datasets":
            _remove_empty_parents(path.parent, levels=3)
        removed.append(r)
        echo(f"removed {format_bytes(r['bytes']):>10}  {path}")
    own = leantrain_cache_dir()
    for r in entries():  # what is left: leantrain's own entries (the record among them)
        p = Path(r["path"])
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
        removed.append(r)
        echo(f"removed {format_bytes(r['bytes']):>10}  {p}")
    if own.is_dir() and not any(own.iterdir()):
        own.rmdir()
    n = len(removed)
    echo(f"removed {format_bytes(sum(r['bytes'] for r in removed))} in {n} entr{'y' if n == 1 else 'ies'}"
         if removed else "nothing to remove")
    return removed


def _remove_empty_parents(folder: Path, levels: int) -> None:
    """``<cache>/csv/default-<hash>/0.0.0/<hash>``: the version and config folders left empty (and their lock
    files' siblings stay alone) go too."""
    for _ in range(levels):
        try:
            folder.rmdir()  # only when empty
        except OSError:
            return
        folder = folder.parent
