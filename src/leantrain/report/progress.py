"""Progress on the main process only: a tqdm bar on a terminal, plain log lines otherwise; and the long work inside a
step or an evaluation (a generation's tokens, the eval batches: ``leantrain.heartbeat``) as a second bar, or a line
every ``work_every`` seconds."""

from __future__ import annotations

import logging
import sys
import time

from leantrain.heartbeat import Work
from leantrain.units import format_duration, format_rate

log = logging.getLogger("leantrain")


def _fmt(metrics: dict[str, float]) -> str:
    parts = []
    for k, v in metrics.items():
        if k == "lr":
            parts.append(f"lr={v:.2e}")
        elif k == "tokens_per_second" and isinstance(v, float):
            parts.append(f"tokens/s={v:,.0f}")
        elif isinstance(v, float):
            parts.append(f"{k}={v:.4g}")
        else:
            parts.append(f"{k}={v}")
    return " ".join(parts)


def work_details(work: Work) -> str:
    """``2,816 new tokens, 4 rows done, 1,234 new tokens/s, eta <= 0:15``: its counts, the rate of the first, the
    time left (``<=`` where it may end early)."""
    rated = next(iter(work.counts), None)
    parts = [*(f"{v:,} {k}" for k, v in work.counts.items()), f"{format_rate(work.rate(rated))} "
             f"{rated or work.unit}/s"]
    if work.done:
        parts.append(f"eta {'<= ' if work.may_end_early else ''}{format_duration(work.eta())}")
    return ", ".join(parts)


def describe_work(work: Work) -> str:
    """``generation of 32 rows: 96/256 positions, 2,816 new tokens, ...`` (``work_details``)."""
    return f"{work.what}: {work.done:,}/{work.total:,} {work.unit}, {work_details(work)}"


class Progress:
    """The training bar (or lines), and the sink of ``leantrain.heartbeat`` while enabled (``sink``)."""

    def __init__(self, total: int, *, enabled: bool, mode: str = "auto", initial: int = 0, work_every: float = 10.0,
                 clock=time.perf_counter):  # noqa: ANN001 - () -> seconds
        self.total = total
        self.enabled = enabled and mode != "none"
        use_bar = mode == "bar" or (mode == "auto" and sys.stderr.isatty())
        self.bar = None
        self.clock = clock
        self.t0 = clock()
        self.initial = initial
        self.use_bar = self.enabled and use_bar
        self.every = 1.0 if self.use_bar else work_every  # a bar redraws in place: more often
        self.work_bars: dict[int, object] = {}
        if self.use_bar and total:  # total 0: the long work of a command that trains nothing (eval, generate)
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)

    @property
    def sink(self) -> "Progress | None":
        """This object as ``heartbeat.reporting``'s sink where it prints, else None (no work is ever due)."""
        return self if self.enabled else None

    def show(self, work: Work) -> None:
        """A line of long work (``heartbeat``): a bar of its own under the training bar, else a log line."""
        if not self.use_bar:
            log.info(describe_work(work))
            return
        bar = self.work_bars.get(id(work))
        if bar is None:
            from tqdm.auto import tqdm

            bar = self.work_bars[id(work)] = tqdm(total=work.total, desc=work.what, unit=work.unit, leave=False,
                                                  position=len(self.work_bars) + (self.bar is not None), dynamic_ncols=True)
        bar.n = work.done
        bar.set_postfix_str(work_details(work), refresh=True)

    def end(self, work: Work) -> None:
        bar = self.work_bars.pop(id(work), None)
        if bar is not None:
            bar.close()

    def update(self, step: int, metrics: dict[str, float] | None = None) -> None:
        """Called once per optimizer step; ``metrics`` only on logging steps."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            if metrics:
                self.bar.set_postfix_str(_fmt(metrics), refresh=False)
        elif metrics:
            done = step - self.initial
            elapsed = self.clock() - self.t0
            eta = elapsed / max(done, 1) * (self.total - step)
            log.info("step %d/%d %s eta=%s", step, self.total, _fmt(metrics), format_duration(eta))

    def write(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            log.info(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
