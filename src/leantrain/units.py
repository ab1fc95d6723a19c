"""Byte sizes, durations and rates for people: the one formatter of each that every report, log line and command uses."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """``1.50 GiB``, ``512.00 MiB``, ``3.00 KiB`` or ``12 B`` (binary units, two decimals)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def format_duration(seconds: float) -> str:
    """``1:02:03``, ``2:05`` (minutes:seconds under an hour)."""
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_rate(value: float) -> str:
    """A speed with three significant digits at any scale (``0.0123``, ``4.56``, ``1,234``): small numbers keep
    their digits rather than rounding to ``0.0``."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
