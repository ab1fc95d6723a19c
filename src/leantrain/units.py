"""Byte sizes for people: the one formatter every report, log line and command uses."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """``1.50 GiB``, ``512.00 MiB``, ``3.00 KiB`` or ``12 B`` (binary units, two decimals)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
