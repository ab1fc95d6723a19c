"""File helpers every layer uses: the one sha256 of a file (checkpoints, token shards, converted presets; a data
file's content digest, what cache keys name it by) and of a JSON-able value (the fingerprints of token-shard sources,
tokenizers and cache keys); a file and whole folders (a run's model/) written atomically and durably; a full disk
recognised and named."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


_DIGESTS: dict[tuple, str] = {}


def content_digest(path: Path) -> str:
    """The sha256 of a data file's bytes (what cache keys name a source file by: its content, not its size and
    modification time), computed once per process for each version of the file: remembered under (path, size,
    mtime, ctime, inode); ctime changes on every write, even one that sets the modification time back."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def sha256_json(obj) -> str:  # noqa: ANN001
    """The hex sha256 of ``obj`` as JSON (keys sorted; what JSON cannot hold written with ``str``)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


@contextmanager
def atomic_file(path: Path):
    """Yield a temporary path beside ``path`` to write; on success fsync it, rename it over ``path`` and fsync the
    folder (a reader sees the old file or the whole new one, also after a crash); on error remove it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """fsync a folder (its entries: renames into it are durable); a file system that cannot is left as it is."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically and durably (``atomic_file``)."""
    with atomic_file(path) as tmp:
        Path(tmp).write_text(text)


def fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder`` and every folder in it, itself included."""
    for root, _, files in os.walk(folder):
        for name in files:
            with open(Path(root) / name, "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(root))


def replace_folder(src: Path, dst: Path) -> None:
    """Move the whole folder ``src`` to ``dst`` (same disk), replacing a folder there: the old one moved aside to
    ``.old-<name>`` first and removed after, the parent fsynced. ``dst`` is the old folder or the whole new one."""
    old = dst.with_name(f".old-{dst.name}")
    shutil.rmtree(old, ignore_errors=True)
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    fsync_dir(dst.parent)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_folders(parent: Path) -> Iterator[Path]:
    """A fresh folder ``parent/.staging-<id>`` to write whole folders in (a run's model/, adapter/); when the block
    ends without an error, each folder in it is fsynced and moved into ``parent`` (``replace_folder``), as the
    checkpoints are committed. On an error, or a kill (its leftover is removed by the next call), no folder in
    ``parent`` changes: a reader never sees one half-written."""
    parent = Path(parent)
    for stale in [*parent.glob(".staging-*"), *parent.glob(".old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    stage = parent / f".staging-{uuid.uuid4().hex[:8]}"
    stage.mkdir(parents=True)
    try:
        yield stage
        for child in sorted(p for p in stage.iterdir() if p.is_dir()):
            fsync_tree(child)
            replace_folder(child, parent / child.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def disk_full(e: BaseException) -> bool:
    """ENOSPC / EDQUOT as an OSError, or wrapped by safetensors (a SafetensorError naming the IO error)."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)
    return "No space left on device" in text or "StorageFull" in text or "Disk quota exceeded" in text


def disk_of(path: Path) -> str:
    """The disk holding ``path``, for a disk-full message: its mount point and the space left on it."""
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    mount = path
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        free = f"{shutil.disk_usage(path).free / 1e6:,.1f} MB free"
    except OSError:
        free = "space unknown"
    return f"the disk mounted at {mount} ({free})"
