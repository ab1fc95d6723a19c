"""Supervision of the processes a launch starts: torchrun runs in a session of its own, in a process that dies with
the launcher; SIGTERM / SIGINT sent to the launcher are forwarded to it (torchrun forwards them once to every worker
and waits ``GRACE_SECONDS`` for their checkpoint); an exception in the launcher takes the whole group down.
The kernel side of "dies with its parent" (``prctl(PR_SET_PDEATHSIG)``) is ``leantrain.processes``, beneath every
layer, because the tokenising pool of ``leantrain prepare`` and the workers use it too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from leantrain.engine.checkpoint.preempt import SIGNALS
from leantrain.processes import bind_to_parent


def run_group(cmd: list[str], env: dict[str, str]) -> tuple[int, int]:
    """Run torchrun in a session of its own and wait for it. SIGTERM / SIGINT sent to this process are forwarded
    to torchrun's agent, which forwards them once to every worker and waits for them (a terminal's Ctrl-C reaches
    this process alone: the workers are not in the terminal's process group); the agent dies when this process
    dies, and the workers die with the agent, so nothing of the run outlives a SIGKILL here.
    Returns torchrun's exit status and the first signal forwarded (0: none)."""
    if cmd[1] == "-m":  # python -m MODULE ... -> the same, in a process that dies with this one
        cmd = [cmd[0], "-m", "leantrain.launch.supervise", *cmd[2:]]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in SIGNALS}
    try:
        return proc.wait(), (received[0] if received else 0)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        if proc.poll() is None:  # an exception here (not a signal): take the run down with us
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_module_dying_with_parent(argv: list[str]) -> None:
    """``python -m leantrain.launch.supervise MODULE ARGS``: run ``python -m MODULE ARGS`` (torchrun) in a process
    that the kernel SIGKILLs when its parent (the launcher) dies. Done here rather than in a ``preexec_fn``, which is
    not safe in a parent that has threads (pyarrow's). The signal the launcher forwards ends torchrun with its
    ``SignalException`` once the workers have stopped: that ends this process quietly with status 128 + signal."""
    import runpy

    bind_to_parent()
    from torch.distributed.elastic.multiprocessing.api import SignalException

    sys.argv = [argv[0], *argv[1:]]
    try:
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    except SignalException as e:  # the forwarded SIGTERM / SIGINT: torchrun stopped its workers, as it should; its
        # exception would print a traceback over the launcher's own "stopped by ..." line
        sys.exit(128 + int(e.sigval))


if __name__ == "__main__":
    run_module_dying_with_parent(sys.argv[1:])
