"""One run per output_dir: an advisory lock (``fcntl.flock`` on ``output_dir/.lock``) held by rank 0 for the run.

The lock file holds the pid (and host) of the run that holds it. The kernel drops a flock when its process dies, so
a lock file left by a dead process never blocks: only a live run does, and the second one exits 2 naming its pid.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from leantrain.errors import UserError

LOCK_FILE = ".lock"
_held: dict[str, int] = {}  # output_dir -> open file descriptor holding the lock (this process)


def acquire(out: Path) -> None:
    """Lock ``out`` for this process; raises UserError (exit 2) when another live process holds it."""
    import fcntl

    key = str(Path(out).resolve())
    if key in _held:
        return
    path = Path(out) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pid, _, host = os.pread(fd, 256, 0).decode(errors="replace").strip().partition(" ")
        os.close(fd)
        holder = f"pid {pid or 'unknown'}" + (f" on {host}" if host else "")
        raise UserError(f"output_dir {out} is in use by another leantrain run ({holder}, per {path}); wait for "
                        "it to finish, stop it, or choose another output_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    _held[key] = fd


def release(out: Path | None = None) -> None:
    """Drop the lock on ``out`` (every lock this process holds when None). The file stays: it is harmless."""
    import fcntl

    keys = [str(Path(out).resolve())] if out is not None else list(_held)
    for key in keys:
        fd = _held.pop(key, None)
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def hold(out: Path, accelerator) -> None:
    """Rank 0 takes the lock; every rank raises the same error when it cannot."""
    from accelerate.utils import broadcast_object_list

    box = [None]
    if accelerator.is_main_process:
        try:
            acquire(out)
        except UserError as e:
            box[0] = str(e)
    if accelerator.num_processes > 1:
        broadcast_object_list(box, from_process=0)
    if box[0] is not None:
        raise UserError(box[0])
