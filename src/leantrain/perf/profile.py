"""Where a step's time goes: a torch profiler trace and a short table (data, a method's own batches, forward,
backward, optimizer, communication, logging), from the ``record_function`` labels the loop and the step carry.

    leantrain train ... efficiency.profile=true     # output_dir/profile/trace.json + summary.txt
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

log = logging.getLogger("leantrain")

PHASES = ("data", "batches", "forward", "backward", "optimizer", "logging", "evaluation")
COMM_MARKERS = ("allreduce", "all_reduce", "broadcast", "reduce_scatter", "all_gather", "allgather", "gloo", "nccl")


class StepProfiler:
    """Profiles ``active`` optimizer steps after ``wait`` steps; a no-op when disabled."""

    def __init__(self, enabled: bool, out_dir: Path, *, wait: int = 3, active: int = 10, is_main: bool = True):
        self.enabled, self.out_dir, self.is_main = enabled, Path(out_dir), is_main
        self.active = active
        self.prof = None
        if enabled:
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.prof = profile(activities=acts, schedule=schedule(wait=wait, warmup=1, active=active, repeat=1),
                                on_trace_ready=self._write, record_shapes=False)

    def __enter__(self):
        if self.prof is not None:
            self.prof.__enter__()
        return self

    def step(self) -> None:
        if self.prof is not None:
            self.prof.step()

    def __exit__(self, *exc):
        if self.prof is not None:
            self.prof.__exit__(*exc)

    def _write(self, prof) -> None:
        if not self.is_main:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.out_dir / "trace.json"))
        events = prof.key_averages()
        text = phase_table(events, self.active) + "\n\n" + top_ops_table(events, self.active)
        (self.out_dir / "summary.txt").write_text(text + "\n")
        log.info("profile of %d steps -> %s\n%s", self.active, self.out_dir, text)


def phase_times(events) -> dict[str, float]:
    """Seconds per phase label (CPU wall time of the labelled ranges) and communication ops, over the window."""
    out = {p: 0.0 for p in (*PHASES, "communication")}
    for e in events:
        if e.key in out:
            out[e.key] += e.cpu_time_total / 1e6
        elif any(m in e.key.lower() for m in COMM_MARKERS):
            out["communication"] += e.self_cpu_time_total / 1e6
    return out


def phase_table(events, steps: int) -> str:
    times = phase_times(events)
    total = sum(v for k, v in times.items() if k != "communication") or 1.0
    lines = [f"{'phase':<14}{'ms/step':>10}{'share':>8}"]
    for k, v in times.items():
        share = f"{100 * v / total:.1f}%" if k != "communication" else "(in backward)"
        lines.append(f"{k:<14}{1000 * v / max(steps, 1):>10.2f}{share:>8}" if k != "communication"
                     else f"{k:<14}{1000 * v / max(steps, 1):>10.2f}  {share}")
    return "\n".join(lines)


def top_ops_table(events, steps: int, rows: int = 15) -> str:
    """The operators that take the most time of their own (self CPU time), per step: what to optimise next."""
    ops = sorted((e for e in events if e.key.startswith(("aten::", "c10d::", "gloo:", "nccl:"))),
                 key=lambda e: -e.self_cpu_time_total)[:rows]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    lines = [f"{'operator (self time)':<34}{'ms/step':>10}{'share':>8}{'calls/step':>12}"]
    for e in ops:
        lines.append(f"{e.key[:33]:<34}{e.self_cpu_time_total / 1000 / max(steps, 1):>10.2f}"
                     f"{100 * e.self_cpu_time_total / total:>7.1f}%{e.count / max(steps, 1):>12.1f}")
    return "\n".join(lines)
