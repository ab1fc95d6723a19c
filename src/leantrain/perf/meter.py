"""Throughput over the training loop's own wall time: evaluation and saving excluded, warm-up steps excluded."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Throughput:
    """Counts samples and non-padding tokens (all processes together) per optimizer step; tokens are None for
    inputs that are not tokens (images, audio), and tokens/s is then None.

    The first ``skip`` steps are left out (allocator warm-up, lazy init, compilation); if the run is too short
    to have any step after them, every step counts. ``pause()``/``resume()`` cut evaluation and saving out.
    """

    skip: int = 3
    steps: int = 0
    _t0: float = field(default_factory=time.perf_counter)
    _paused_at: float | None = None
    all_time: float = 0.0
    all_samples: int = 0
    all_tokens: int = 0
    time: float = 0.0
    samples: int = 0
    tokens: int = 0
    counts_tokens: bool = True

    def start_step(self) -> None:
        self._t0 = time.perf_counter()

    def end_step(self, samples: int, tokens: int | None) -> None:
        dt = time.perf_counter() - self._t0
        self.steps += 1
        self.all_time += dt
        self.all_samples += samples
        self.counts_tokens = tokens is not None
        self.all_tokens += tokens or 0
        if self.steps > self.skip:
            self.time += dt
            self.samples += samples
            self.tokens += tokens or 0

    def _window(self) -> tuple[float, int, int]:
        if self.steps > self.skip and self.time > 0:
            return self.time, self.samples, self.tokens
        return self.all_time, self.all_samples, self.all_tokens

    @property
    def samples_per_second(self) -> float:
        t, s, _ = self._window()
        return s / t if t > 0 else 0.0

    @property
    def tokens_per_second(self) -> float | None:
        if not self.counts_tokens:
            return None
        t, _, k = self._window()
        return k / t if t > 0 else 0.0

    @property
    def measured_steps(self) -> int:
        return self.steps - self.skip if self.steps > self.skip else self.steps


@dataclass
class PhaseClock:
    """Wall time per phase of the step (data / compute / optimizer), summed over the run, read on the host.

    It never synchronises a device: the caller enables compute/optimizer laps only where the device is the host
    (CPU), so the split is exact there; on an accelerator only the data phase (host time waiting for the next
    micro-batches) is measured.
    """

    totals: dict[str, float] = field(default_factory=dict)
    _t: float = 0.0
    _logged: dict[str, float] = field(default_factory=dict)  # the totals at the last ``since_last``

    def start(self) -> None:
        self._t = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.totals[phase] = self.totals.get(phase, 0.0) + now - self._t
        self._t = now

    def summary(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.totals.items()}

    def since_last(self) -> dict[str, float]:
        """The seconds per phase since the previous call (since the start at the first): a logging window's split."""
        window = {k: v - self._logged.get(k, 0.0) for k, v in self.totals.items()}
        self._logged = dict(self.totals)
        return {k: v for k, v in window.items() if v > 0}


def time_split(window: dict[str, float], steps: int) -> dict[str, dict[str, float]]:
    """A logging window's phases (``PhaseClock.since_last``) as a train record's ``time_split`` (seconds per optimizer
    step) and ``time_share`` (the share of the measured time)."""
    total = sum(window.values())
    if not window or steps <= 0 or total <= 0:
        return {}
    return {"time_split": {k: round(v / steps, 4) for k, v in window.items()},
            "time_share": {k: round(v / total, 4) for k, v in window.items()}}


def largest_share(record: dict) -> dict[str, str]:
    """The progress line's note of where a logged window's time went: its largest phase and share
    (``{"time": "generation 63%"}``), or nothing when the record has no split."""
    share = record.get("time_share") or {}
    if not share:
        return {}
    phase = max(share, key=share.get)
    return {"time": f"{phase} {share[phase]:.0%}"}
