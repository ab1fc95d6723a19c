"""Start the workers of a multi-process run through torchrun (torch.distributed.run), the engine clusters use.

leantrain writes no launcher of its own: ``--nproc`` / ``--nnodes`` / ``--node-rank`` / ``--master-addr`` /
``--master-port`` map onto torchrun's flags. The config and data are validated once, here, before any worker
starts; the workers read the resolved config from a file, and what else the parent checked from another
(``engine.run_file``). Under your own launcher (``torchrun ... -m leantrain
train cfg.yaml`` or ``accelerate launch --multi_gpu --num_processes N -m leantrain train cfg.yaml``) nothing here
runs: each worker finds its rank in the environment.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from leantrain.config import Config
from leantrain.engine.checkpoint.preempt import EXIT_PREEMPTED, GRACE_SECONDS, STATUS_FILE, read_status
from leantrain.engine.setup.run_file import inside_launcher, write_run_file  # noqa: F401 - inside_launcher: for cli
from leantrain.errors import UserError
from leantrain.launch.supervise import run_group

log = logging.getLogger("leantrain")


@dataclass
class LaunchOptions:
    nproc: int = 1  # processes on this machine
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def wanted(self) -> bool:
        return self.nproc > 1 or self.nnodes > 1

    def check(self) -> None:
        if self.nproc < 1 or self.nnodes < 1:
            raise UserError("--nproc and --nnodes must be at least 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise UserError(f"--node-rank {self.node_rank} must be in 0..{self.nnodes - 1} (--nnodes {self.nnodes})")
        if self.nnodes > 1 and not self.master_addr:
            raise UserError("--nnodes > 1 needs --master-addr (the address of the node with --node-rank 0)")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise UserError(f"--master-port {self.master_port}: a TCP port is 1..65535 (e.g. 29500)")
        if self.master_addr is not None:
            check_host(self.master_addr, "--master-addr")


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def check_host(addr: str, option: str, timeout: float = 10.0) -> None:
    """UserError unless ``addr`` is an IP address or a host name that resolves. A name lookup that does not answer
    within ``timeout`` seconds is let through (the rendezvous then reports it): only a definite 'no' stops the run."""
    try:
        ipaddress.ip_address(addr.strip("[]"))
        return
    except ValueError:
        pass
    labels = addr.rstrip(".").split(".")
    if not addr or len(addr) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels) or \
            all(label.isdigit() for label in labels):
        raise UserError(f"{option} {addr!r}: not an IP address or a host name (e.g. 10.0.0.1 or node01)")
    result: list = []

    def lookup() -> None:
        try:
            result.append(socket.getaddrinfo(addr, None))
        except OSError as e:
            result.append(e)

    worker = threading.Thread(target=lookup, daemon=True)
    worker.start()
    worker.join(timeout)
    if result and isinstance(result[0], OSError):
        raise UserError(f"{option} {addr!r}: no such host ({result[0].strerror or result[0]}); give the address of "
                        "the machine with --node-rank 0")


def torchrun_command(opts: LaunchOptions, config_file: Path) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={opts.nproc}",
           f"--shutdown-timeout={GRACE_SECONDS}"]  # time the workers get to checkpoint after SIGTERM / SIGINT
    if opts.nnodes == 1 and opts.master_port is None:
        cmd.append("--standalone")  # a free local port for the rendezvous
    else:
        cmd += [f"--nnodes={opts.nnodes}", f"--node-rank={opts.node_rank}",
                f"--master-addr={opts.master_addr or '127.0.0.1'}", f"--master-port={opts.master_port or 29500}"]
    return cmd + ["-m", "leantrain", "train", str(config_file)]


def worker_env(opts: LaunchOptions) -> dict[str, str]:
    from leantrain.engine.devices.accelerator import has_accelerator  # lazy: torch loads only when launching

    env = dict(os.environ)
    if not has_accelerator() and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // opts.nproc))  # cores shared by local workers
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def launch(cfg: Config, opts: LaunchOptions, facts: dict | None = None) -> int:
    """Run ``cfg`` on ``opts.nproc`` processes here (x ``opts.nnodes`` machines); returns the exit status. ``facts``:
    what the parent checked beside the config (``RunDescription.facts``: the task), which the workers trust."""
    opts.check()
    with tempfile.TemporaryDirectory(prefix="leantrain-launch-") as tmp:
        config_file = Path(tmp) / "config.yaml"
        config_file.write_text(cfg.to_yaml())
        cmd = torchrun_command(opts, config_file)
        total = opts.nproc * opts.nnodes
        log.info("launching %d process(es) on this machine (%d in all): %s", opts.nproc, total, " ".join(cmd))
        env = {**worker_env(opts), STATUS_FILE: str(Path(tmp) / "status.json"),
               **(write_run_file(Path(tmp), facts) if facts is not None else {})}
        rc, signum = run_group(cmd, env)
        status = read_status(Path(tmp) / "status.json")
    if status and status.get("preempted"):
        print(f"leantrain: stopped by {status['signal']} after step {status['step']}; checkpoint {status['checkpoint']}"
              f"; run the same command again to resume (exit status {EXIT_PREEMPTED})", file=sys.stderr)
        return EXIT_PREEMPTED
    if signum and rc != 0:  # told to stop, not a worker failure
        print(f"leantrain: stopped by {signal.Signals(signum).name} before the workers could write a checkpoint; "
              "the next run resumes from the newest complete one", file=sys.stderr)
        return 128 + signum
    if rc != 0:
        print(f"leantrain: error: a worker failed (exit status {rc}); its rank and error are shown above",
              file=sys.stderr)
    return rc
