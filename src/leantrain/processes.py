"""Processes that die with their parent: ``prctl(PR_SET_PDEATHSIG)`` on Linux, used by every process leantrain
starts (torchrun's agent and workers, the tokenising pool of ``leantrain prepare``), so that nothing of a command
outlives a SIGKILL of it."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent exits (``prctl(PR_SET_PDEATHSIG)``); a no-op
    elsewhere. Survives exec, so it also works as a ``preexec_fn``."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return


def bind_to_parent() -> None:
    """Be SIGKILLed when the parent dies; exit now when it died before ``prctl`` took effect."""
    parent = os.getppid()
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
