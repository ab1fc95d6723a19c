"""Fault injection, to check that a failing process stops the whole run (on a laptop or a cluster).

``LEANTRAIN_FAULT=KIND@STEP[:RANK]`` makes process RANK (default 0) fail when it reaches optimizer step STEP:
``raise`` raises an exception, ``kill`` sends itself SIGKILL. Unset, this costs one dict lookup per run.
"""

from __future__ import annotations

import os
import signal


def parse(spec: str | None) -> tuple[str, int, int] | None:
    if not spec:
        return None
    try:
        kind, rest = spec.split("@", 1)
        step, _, rank = rest.partition(":")
        if kind not in ("raise", "kill"):
            raise ValueError
        return kind, int(step), int(rank or 0)
    except ValueError:
        raise ValueError(f"LEANTRAIN_FAULT={spec!r}: expected KIND@STEP[:RANK] with KIND raise or kill") from None


class FaultInjector:
    def __init__(self, rank: int):
        fault = parse(os.environ.get("LEANTRAIN_FAULT"))
        self.fault = fault if fault and fault[2] == rank else None

    def at_step(self, step: int) -> None:
        if self.fault is None or step != self.fault[1]:
            return
        if self.fault[0] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected fault at step {step} (LEANTRAIN_FAULT)")
