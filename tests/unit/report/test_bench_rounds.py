"""`leantrain bench` rounds: interleaved by default, median with its min-max spread, "within noise" when the
spreads overlap, and a chart that says what was measured how often (fabricated measurements, no training)."""

import json

from pathlib import Path

from leantrain.commands.bench import DEFAULT_ROUNDS, Variant, result_of
from leantrain.report import bench_report


def _summary(sps, mem=100e6):
    return {"train": {"samples_per_second": sps, "tokens_per_second": sps * 20, "peak_memory_bytes": mem,
                      "steps": 5}, "eval": {"loss": 0.5, "accuracy": 0.8}, "optim": {"state_bytes": 8e6},
            "device": {"type": "cpu"}}


def _rows(measured: dict[str, list[float]]):
    variants = []
    for label, values in measured.items():
        v = Variant([label])
        v.summaries = [_summary(x) for x in values]
        variants.append(v)
    return result_of(variants, "leantrain bench", Path("bench"), max(map(len, measured.values())))["rows"]


def test_spread_and_within_noise_when_ranges_overlap():
    rows = _rows({"optim.name=adamw": [182.0, 95.0, 120.0], "optim.name=sgd": [11.7, 130.0, 110.0],
                  "optim.name=lion": [300.0, 310.0, 290.0], "optim.name=adafactor": [50.0, 55.0, 60.0]})
    by = {r["variant"]: r for r in rows}
    adamw = by["optim.name=adamw"]
    assert adamw["samples_per_second"] == 120.0  # the median, not the single 182
    assert (adamw["samples_per_second_min"], adamw["samples_per_second_max"]) == (95.0, 182.0)
    assert adamw["speed_vs_baseline"] == "baseline"
    assert by["optim.name=sgd"]["speed_vs_baseline"] == "within noise"
    assert by["optim.name=lion"]["speed_vs_baseline"] == "faster"
    assert by["optim.name=adafactor"]["speed_vs_baseline"] == "slower"
    table = bench_report.format_table(rows)
    assert "spread" in table.splitlines()[0] and "95.0-182.0" in table
    assert "median of 3 interleaved round(s)" in table
    assert "within noise: the samples/s spread of optim.name=sgd overlaps the baseline's" in table
    assert "optim.name=lion" not in table.split("within noise:")[1]


def test_one_round_says_no_spread_was_measured():
    rows = _rows({"optim.name=adamw": [182.0], "optim.name=sgd": [11.7]})
    assert rows[1]["speed_vs_baseline"] == "one round"
    table = bench_report.format_table(rows)
    assert "no spread measured" in table and "--rounds 3" in table


def test_chart_says_what_was_measured_how_often(tmp_path):
    rows = _rows({"a=1": [10.0, 12.0, 11.0], "a=2": [11.5, 13.0, 12.5]})
    rows.append({"variant": "a=3", "overrides": ["a=3"], "status": "error", "error": "boom", "runs": 0})
    title = bench_report.chart_title(rows, 3)
    assert "median of 3 interleaved run(s)" in title and "min-max" in title and "1 failed" in title
    result = {"rows": rows, "rounds": 3}
    bench_report.write_all(result, tmp_path)
    assert (tmp_path / "bench.png").stat().st_size > 5000
    assert json.loads((tmp_path / "bench.json").read_text())["rows"][1]["speed_vs_baseline"] == "within noise"
    header = (tmp_path / "bench.csv").read_text().splitlines()[0]
    assert "samples_per_second_min" in header and "speed_vs_baseline" in header


def test_rounds_default_to_three_and_repeat_still_works():
    from leantrain.cli import _parser

    _, subs = _parser()
    assert DEFAULT_ROUNDS >= 3 and subs["bench"].parse_intermixed_args([]).rounds >= 3
    assert subs["bench"].parse_intermixed_args(["--repeat", "2"]).rounds == 2
    assert subs["bench"].parse_intermixed_args(["--rounds", "4"]).rounds == 4
