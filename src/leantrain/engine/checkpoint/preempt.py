"""Preemption: SIGTERM / SIGINT stop a run at a step boundary with a checkpoint, and processes die with their parent.

How SLURM, Kubernetes and spot instances stop a job is SIGTERM, then SIGKILL after a grace period; Ctrl-C is SIGINT.
During training, the first SIGTERM or SIGINT only sets a flag (a signal handler does nothing else). At the next
optimizer-step boundary the processes agree on the step, write a checkpoint there (unless one was just written) and
the run exits with status ``EXIT_PREEMPTED`` (75, ``EX_TEMPFAIL``: "try again"); running the same command again
resumes from that checkpoint, bitwise equal to a run that was never stopped. A second signal aborts at once
(SIGINT -> exit 130, SIGTERM -> killed by SIGTERM); the newest complete checkpoint is still intact.

Agreement. Each process may see the signal at a different step, so the flag is all-reduced (max) at a step boundary
and every process stops after the same step. Reading the result back is a host synchronisation, which the training
step must not have on every step on an accelerator, so:

- 1 process: the Python flag is read at every step boundary (no collective at all);
- several processes on CPU (the host is the device): the flag is all-reduced at every step boundary (one int);
- several processes on an accelerator: the flag is all-reduced on logging steps (``train.log_every_steps``, which
  synchronise anyway), checkpoint steps and the last step; the stop waits at most one logging interval.

The launcher (``--nproc``) forwards SIGTERM / SIGINT to torchrun, which forwards it once to every worker and waits
for them (``--shutdown-timeout``, ``GRACE_SECONDS`` here) before it SIGKILLs them. Every worker asks the kernel to
SIGKILL it when its parent (torchrun's agent) dies, and the agent to die when the launcher dies, so a SIGKILLed
launcher leaves no process of the run behind.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from leantrain.errors import UserError
from leantrain.processes import bind_to_parent

log = logging.getLogger("leantrain")

EXIT_PREEMPTED = 75  # EX_TEMPFAIL from sysexits.h: stopped on request with a checkpoint; run again to resume
SIGNALS = (signal.SIGTERM, signal.SIGINT)
GRACE_SECONDS = 120  # torchrun waits this long for the workers to checkpoint and exit before it SIGKILLs them
STATUS_FILE = "LEANTRAIN_STATUS_FILE"  # set by the launcher: where rank 0 records that the run was preempted


class Preempted(UserError):
    """The run stopped on SIGTERM / SIGINT after writing a checkpoint."""

    exit_code = EXIT_PREEMPTED


def worker_start() -> None:
    """In a worker started by torchrun: die when the agent dies (it may already be gone: then exit now)."""
    bind_to_parent()


class Preemption:
    """The signal flag of one process and the agreement on it across processes."""

    def __init__(self, accelerator, layout, log_every: int, checkpoint_due):
        self.accelerator, self.layout, self.log_every, self.checkpoint_due = accelerator, layout, log_every, checkpoint_due
        self.signum = 0
        self.previous: dict[int, object] = {}
        self.host_is_device = accelerator.device.type == "cpu"

    # --- the handler ---------------------------------------------------------------------------------------------
    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread (an in-process call from a thread)
        for sig in SIGNALS:
            self.previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, old in self.previous.items():
            signal.signal(sig, old)
        self.previous = {}

    def _handle(self, signum, frame) -> None:
        if self.signum:  # the second signal: abort at once
            self.uninstall()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        if self.accelerator.is_main_process:
            print(f"leantrain: got {signal.Signals(signum).name}: finishing this step, then saving a checkpoint and "
                  "stopping (send it again to abort at once)", file=sys.stderr, flush=True)

    # --- the agreement -------------------------------------------------------------------------------------------
    def agreed(self, step: int) -> int:
        """The signal every process stops on after ``step`` (0: go on). A collective on multi-process sync steps."""
        acc = self.accelerator
        if acc.num_processes == 1:
            return self.signum
        if not (self.host_is_device or step % self.log_every == 0 or self.checkpoint_due(step)
                or step >= self.layout.total_steps):
            return 0
        import torch

        flag = torch.tensor([self.signum], device=acc.device, dtype=torch.int64)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return int(flag.item())


    def stop_signal(self, step: int) -> str | None:
        """At the boundary after ``step``: the name of the signal every process agrees to stop on (``SIGTERM``), or
        None to go on (also for a signal during the last step: the run finishes). The loop acts on it: it saves
        its checkpoint, then calls :meth:`stop`."""
        signum = self.agreed(step)
        return signal.Signals(signum).name if signum and step < self.layout.total_steps else None

    def stop(self, name: str, step: int, checkpoint) -> None:
        """End the run stopped by signal ``name`` after ``step``, its state in ``checkpoint``: the status for the
        launcher (rank 0), the process group closed, and ``Preempted`` raised (exit status ``EXIT_PREEMPTED``)."""
        import torch

        acc = self.accelerator
        if acc.is_main_process:
            _write_status({"preempted": True, "signal": name, "step": step, "checkpoint": str(checkpoint)})
        acc.end_training()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        if acc.is_main_process:
            raise Preempted(f"stopped by {name} after step {step} of {self.layout.total_steps}; checkpoint {checkpoint}; "
                            f"run the same command again to resume from it (exit status {EXIT_PREEMPTED})")
        raise Preempted(f"process {acc.process_index}: stopped by {name} after step {step} (see process 0)")


def _write_status(status: dict) -> None:
    path = os.environ.get(STATUS_FILE)
    if path:
        Path(path).write_text(json.dumps(status))


def read_status(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
