"""The host allocator: memory reuse during training (``efficiency.cpu_allocator``).

glibc serves every allocation above 32 MiB (and, by default, many above 128 KiB) with a fresh ``mmap`` and gives it
back with ``munmap`` when freed. A training step frees and re-allocates the same big buffers every step (the word
embedding's dense gradient alone is 47 MB for MiniLM), so each step page-faults them in again and the kernel zeroes
every page: ~5% of a CPU step on the vs_trainer job (``benchmarks/speed/fast_paths.py``). ``reuse`` turns off mmap for big blocks and trimming, so freed
blocks stay in the process's heap and the next step reuses them (what jemalloc/tcmalloc do, without a preload).
The process keeps its peak until the run ends (fragmentation adds a little: 1.48 against 1.45 GiB on that job),
when the settings are put back and the heap is trimmed. Linux with glibc only; elsewhere, or when the user set ``MALLOC_*`` / ``GLIBC_TUNABLES`` or preloads
an allocator, nothing is changed.

Where: ``auto`` (the default) applies it to CPU training only, where it was measured; on a GPU the big buffers live
in device memory and the host side is not the cost, so the process's allocator is left alone. ``reuse`` applies it
on any device; ``system`` never.

What "restored" means: glibc's ``mallopt`` sets values but has no getter, so leantrain cannot read settings made by
other code in the process. It therefore (1) changes nothing when the environment tuned the allocator (then the
previous settings are the user's, and stay); (2) keeps a stack of its own settings, so a nested or repeated use
(``leantrain bench`` / tests running ``train()`` several times in one process) puts back what the enclosing use set,
not glibc's defaults; (3) at the outermost exit puts back glibc's documented defaults (trim threshold 128 KiB,
mmap max 65536), which were the settings in force, since nothing else had set them. One difference remains: any
``mallopt`` call turns off glibc's dynamic mmap threshold for the rest of the process, and glibc has no call to turn
it back on.
"""

from __future__ import annotations

import ctypes
import os
import platform
from contextlib import contextmanager

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt parameters (malloc.h)
GLIBC_DEFAULTS = {M_TRIM_THRESHOLD: 128 * 1024, M_MMAP_MAX: 65536}
REUSE = {M_TRIM_THRESHOLD: 2**31 - 1, M_MMAP_MAX: 0}


def tunable_glibc():
    """The C library when it is glibc and the user has not tuned or replaced the allocator; else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    if "GLIBC_TUNABLES" in os.environ or any(k.startswith("MALLOC_") for k in os.environ):
        return None
    if any(a in os.environ.get("LD_PRELOAD", "") for a in ("jemalloc", "tcmalloc", "mimalloc")):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def set_malloc_params(libc, params: dict[int, int]) -> bool:
    return all(libc.mallopt(ctypes.c_int(k), ctypes.c_int(v)) == 1 for k, v in params.items())


_applied: list[dict[int, int]] = []  # leantrain's own settings in force, innermost last


@contextmanager
def host_memory(mode: str, device: str = "cpu"):
    """Within the block, ``mode='reuse'`` (or ``'auto'`` on a CPU ``device``) keeps freed host memory for reuse (see
    the module docstring). Yields what was done, for the log: 'reuse', or 'system' when nothing was changed."""
    wanted = mode == "reuse" or (mode == "auto" and device == "cpu")
    libc = tunable_glibc() if wanted else None
    if libc is None or not set_malloc_params(libc, REUSE):
        yield "system"
        return
    _applied.append(REUSE)
    try:
        yield "reuse"
    finally:
        _applied.pop()
        # the previous settings: leantrain's own, else glibc's
        set_malloc_params(libc, _applied[-1] if _applied else GLIBC_DEFAULTS)
        if not _applied:
            libc.malloc_trim(ctypes.c_size_t(0))
