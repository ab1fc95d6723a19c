"""Progress from inside long work that runs below the report layer: a generation's new tokens, an evaluation's batches.

The process that prints (rank 0) opens ``reporting(sink)`` around the run (the training loop, ``leantrain eval``);
the work opens ``work(what, total, unit)`` and, when ``due()``, calls ``update(done, **counts)``. ``due()`` reads a
clock and nothing else, so a decode loop may ask it at every token: the work computes its counts (which may read
device values) only when the sink wants a line, at most once per the sink's ``every`` seconds, and never on the
processes that print nothing (no sink: never due). A short piece of work, done before its first ``every`` seconds,
says nothing.

A sink has ``every`` (seconds between two lines of one work), ``clock()`` (seconds), ``show(work)`` and
``end(work)`` (called once at its end when it was shown): ``report.progress.Progress`` is the one that prints.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Protocol


class Sink(Protocol):
    every: float

    def clock(self) -> float: ...
    def show(self, work: "Work") -> None: ...
    def end(self, work: "Work") -> None: ...


_SINK: ContextVar[Sink | None] = ContextVar("leantrain_progress_sink", default=None)


class Work:
    """``total`` ``unit`` (plural: positions, batches) of ``what``, ``done`` of them done; ``counts``: what the work adds (new
    tokens, rows done), the first one the rate shown; ``may_end_early``: the work can stop before ``total`` (a
    generation whose rows all end), so the time left is an upper bound."""

    def __init__(self, what: str, total: int, unit: str, sink: Sink | None, may_end_early: bool = False):
        self.what, self.total, self.unit, self.sink, self.may_end_early = what, total, unit, sink, may_end_early
        self.done, self.counts, self.shown = 0, {}, False
        self.start = sink.clock() if sink is not None else 0.0
        self.next_at = self.start + sink.every if sink is not None else math.inf

    def due(self) -> bool:
        """Whether the sink wants a line now (never without a sink)."""
        return self.sink is not None and self.sink.clock() >= self.next_at

    def update(self, done: int, counts: dict[str, int] | None = None) -> None:
        """``done`` of ``total`` units are done (and ``counts``): shown now."""
        if self.sink is None:
            return
        self.done, self.counts, self.shown = done, dict(counts or {}), True
        self.sink.show(self)
        self.next_at = self.sink.clock() + self.sink.every

    @property
    def elapsed(self) -> float:
        return self.sink.clock() - self.start if self.sink is not None else 0.0

    def rate(self, count: str | None = None) -> float:
        """Units (or ``counts[count]``) per second so far."""
        value = self.done if count is None else self.counts.get(count, 0)
        return value / self.elapsed if self.elapsed > 0 else 0.0

    def eta(self) -> float:
        """Seconds left at the pace so far, if every unit left is done (an upper bound where work may end early)."""
        return self.elapsed / self.done * (self.total - self.done) if self.done else math.inf


@contextmanager
def work(what: str, total: int, unit: str, may_end_early: bool = False) -> Iterator[Work]:
    """One piece of long work, reported to the open sink (none: ``due()`` stays false)."""
    sink = _SINK.get()
    w = Work(what, total, unit, sink, may_end_early)
    try:
        yield w
    finally:
        if sink is not None and w.shown:
            sink.end(w)


@contextmanager
def reporting(sink: Sink | None) -> Iterator[None]:
    """Work opened inside reports to ``sink`` (None: to nothing), in this thread and context only."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)
