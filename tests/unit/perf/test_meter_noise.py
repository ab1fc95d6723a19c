"""Throughput counting (perf/meter.py) and ranking speeds only where the ranges allow it (perf/noise.py). The
meter's clock is set back by hand so that each step's duration is known; no test waits."""

import time

import pytest

from leantrain.perf.meter import PhaseClock, Throughput
from leantrain.perf.noise import FASTEST, SLOWER, WITHIN_NOISE, overlap, rank_by_speed


def _step(meter: Throughput, seconds: float, samples: int, tokens: int | None) -> None:
    meter.start_step()
    meter._t0 -= seconds  # this step took `seconds` (plus the microseconds of the call)
    meter.end_step(samples, tokens)


def test_throughput_leaves_out_the_warm_up_steps():
    meter = Throughput(skip=2)
    _step(meter, 100.0, 8, 800)  # warm-up: slow, left out
    _step(meter, 100.0, 8, 800)
    _step(meter, 1.0, 10, 1000)
    _step(meter, 1.0, 30, 3000)
    assert (meter.steps, meter.measured_steps, meter.samples, meter.all_samples) == (4, 2, 40, 56)
    assert meter.samples_per_second == pytest.approx(20.0, rel=1e-3)
    assert meter.tokens_per_second == pytest.approx(2000.0, rel=1e-3)


def test_a_run_shorter_than_the_warm_up_counts_every_step():
    meter = Throughput(skip=3)
    _step(meter, 2.0, 10, 100)
    _step(meter, 2.0, 30, 300)
    assert meter.measured_steps == 2 and meter.samples == 0
    assert meter.samples_per_second == pytest.approx(10.0, rel=1e-3)
    assert meter.tokens_per_second == pytest.approx(100.0, rel=1e-3)


def test_throughput_without_tokens_and_before_any_step():
    assert Throughput().samples_per_second == 0.0 and Throughput().tokens_per_second == 0.0
    meter = Throughput(skip=0)
    _step(meter, 1.0, 4, None)  # images: no tokens
    assert meter.tokens_per_second is None and meter.samples_per_second == pytest.approx(4.0, rel=1e-3)


def test_phase_clock_sums_laps_per_phase():
    clock = PhaseClock()
    clock.start()
    for _ in range(3):
        clock._t -= 1.0
        clock.lap("data")
        clock._t -= 2.0
        clock.lap("compute")
    assert list(clock.totals) == ["data", "compute"]
    assert clock.summary()["data"] == pytest.approx(3.0, abs=1e-3)
    assert clock.summary()["compute"] == pytest.approx(6.0, abs=1e-3)
    assert clock._t <= time.perf_counter()


def test_a_logging_windows_time_split_is_seconds_per_step_and_shares_of_the_window():
    from leantrain.perf.meter import largest_share, time_split

    clock = PhaseClock(totals={"data": 1.0, "generation": 6.0})
    assert clock.since_last() == {"data": 1.0, "generation": 6.0}
    clock.totals.update(data=2.0, compute=3.0)  # the next window: 1 s of data, 3 s of compute, no generation
    window = clock.since_last()
    assert window == {"data": 1.0, "compute": 3.0}
    rec = time_split(window, steps=2)
    assert rec == {"time_split": {"data": 0.5, "compute": 1.5}, "time_share": {"data": 0.25, "compute": 0.75}}
    assert largest_share(rec) == {"time": "compute 75%"} and largest_share({}) == {}
    assert time_split({}, steps=2) == {} and time_split(window, steps=0) == {}


def test_overlap_counts_touching_ranges():
    assert overlap((1, 2), (2, 3)) and overlap((2, 3), (1, 2)) and overlap((1, 5), (2, 3))
    assert not overlap((1, 2), (2.1, 3))


def _row(name, speed, lo=None, hi=None, **extra):
    row = {"name": name, "samples_per_second": speed, **extra}
    if lo is not None:
        row["samples_per_second_range"] = (lo, hi)
    return row


def test_rank_fastest_only_when_no_range_overlaps_the_top():
    ranked = rank_by_speed([_row("a", 100, 95, 105), _row("b", 150, 140, 160), _row("c", 60, 50, 70)])
    assert [(r["name"], r["speed"]) for r in ranked] == [("b", FASTEST), ("a", SLOWER), ("c", SLOWER)]


def test_rows_without_a_range_count_as_exact():
    ranked = rank_by_speed([_row("a", 100), _row("b", 100.5, 99, 102), _row("c", 98)])
    assert [(r["name"], r["speed"]) for r in ranked] == [("b", WITHIN_NOISE), ("a", WITHIN_NOISE), ("c", SLOWER)]
    assert rank_by_speed([_row("x", 1.0), _row("y", 2.0)])[0]["speed"] == FASTEST
    assert rank_by_speed([]) == []


def test_within_noise_group_is_ordered_by_preference_then_speed():
    rows = [_row("fast-but-far", 110, 90, 120, changes=2), _row("near", 100, 85, 115, changes=0),
            _row("also-near", 105, 95, 112, changes=0), _row("slow", 50, 40, 60, changes=0)]
    ranked = rank_by_speed(rows, prefer=lambda r: r["changes"])
    assert [r["name"] for r in ranked] == ["also-near", "near", "fast-but-far", "slow"]
    assert [r["speed"] for r in ranked] == [WITHIN_NOISE] * 3 + [SLOWER]


def test_rank_by_another_key():
    rows = [{"tokens_per_second": 5.0, "tokens_per_second_range": (4, 6)}, {"tokens_per_second": 9.0}]
    ranked = rank_by_speed(rows, key="tokens_per_second")
    assert [r["tokens_per_second"] for r in ranked] == [9.0, 5.0] and ranked[0]["speed"] == FASTEST
