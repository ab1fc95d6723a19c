"""Ranking measured speeds only where the measurement supports it.

A speed measured a few times on a shared machine is a range, not a number. Two settings are ranked against each
other only when their ranges (min-max of the timed runs) do not overlap; otherwise the difference is "within noise"
and nothing should call one of them the faster. Used by ``leantrain plan`` (predicted samples/s from timed
calibration passes) and in the same spirit by ``leantrain bench`` (measured samples/s over interleaved rounds).
"""

from __future__ import annotations

FASTEST, WITHIN_NOISE, SLOWER = "fastest", "within noise", "slower"


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two (low, high) ranges overlap (touching counts)."""
    return a[0] <= b[1] and b[0] <= a[1]


def rank_by_speed(rows: list[dict], key: str = "samples_per_second", prefer=None) -> list[dict]:
    """``rows`` sorted by ``key`` (highest first), each given ``speed``: the top row is ``fastest`` only when its
    ``<key>_range`` overlaps no other row's; every row whose range overlaps the top row's is ``within noise``
    (the top row then too); the rest are ``slower``. Rows without a range count as exact. Within the group that
    is within noise the measured order means nothing, so it is ordered by ``prefer(row)`` (smaller first, e.g. how
    many settings differ from the user's) and only then by ``key``."""
    ranked = sorted(rows, key=lambda r: -r[key])
    if not ranked:
        return ranked

    def rng(r: dict) -> tuple[float, float]:
        lo, hi = r.get(f"{key}_range") or (r[key], r[key])
        return float(lo), float(hi)

    top = ranked[0]
    tied = [r for r in ranked[1:] if overlap(rng(top), rng(r))]
    top["speed"] = WITHIN_NOISE if tied else FASTEST
    for r in ranked[1:]:
        r["speed"] = WITHIN_NOISE if overlap(rng(top), rng(r)) else SLOWER
    if tied and prefer is not None:
        group = [r for r in ranked if r["speed"] == WITHIN_NOISE]
        rest = [r for r in ranked if r["speed"] != WITHIN_NOISE]
        ranked = sorted(group, key=lambda r: (prefer(r), -r[key])) + rest
    return ranked
