"""`leantrain bench`: sweeps, per-variant validation, fresh training processes, table/CSV/JSON/PNG."""

import csv
import json

import pytest

from tests.helpers import alternating_rows, write_rows
from leantrain.cli import main
from leantrain.errors import UserError
from leantrain.commands.bench import make_variants, parse_sweeps, result_of, split_values
from leantrain.report import bench_report


def test_sweep_parsing_and_cartesian_product():
    assert split_values("adamw,sgd") == ["adamw", "sgd"]
    assert split_values("[0.9,0.99],[0.9, 0.999]") == ["[0.9,0.99]", "[0.9, 0.999]"]
    sweeps = parse_sweeps(["optim.name=adamw,sgd,lion", "train.lr=1e-3,1e-4"])
    variants = make_variants(sweeps)
    assert len(variants) == 6
    assert variants[0].overrides == ["optim.name=adamw", "train.lr=1e-3"]
    assert variants[1].overrides == ["optim.name=adamw", "train.lr=1e-4"]
    assert variants[0].slug == "optim.name-adamw__train.lr-1e-3"
    assert [v.label for v in make_variants([])] == ["base"]
    for bad in (["optim.name"], ["optim.name="], ["=a,b"], ["optim.name=a,,b"], ["train.lr=1", "train.lr=2"]):
        with pytest.raises(UserError):
            parse_sweeps(bad)


def test_unknown_sweep_key_becomes_error_rows(tmp_path, capsys):
    """A key this build does not know (a typo, another version's key) is an error row per variant, not a crash."""
    out = tmp_path / "b"
    rc = main(["bench", "--sweep", "efficiency.precison=fp32,bf16", f"output_dir={out}", "train.max_steps=1"])
    assert rc == 1  # nothing ran
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["error", "error"]
    assert all("unknown key 'efficiency.precison'" in r["error"] for r in rows)
    assert all("did you mean 'efficiency.precision'" in r["error"] for r in rows)
    assert (out / "bench.csv").is_file() and (out / "bench.png").is_file()
    assert "efficiency.precison=bf16" in capsys.readouterr().out


@pytest.mark.slow  # two training runs, each in a process of its own
def test_bench_2x1_sweep_writes_table_files_and_chart(tmp_path, tiny_bert, capsys):
    """One round (the rounds' medians and spreads: test_two_rounds_give_each_variant_its_median_and_spread)."""
    data = write_rows(tmp_path / "train.csv", alternating_rows(48, max_repeat=4))
    out = tmp_path / "bench"
    rc = main(["bench", f"model.name={tiny_bert}", "--sweep", "optim.name=adamw,sgd,nonsense", f"data.train={data}",
               "train.max_steps=2", "train.batch_size=16", "--sweep", "train.lr=1e-3", "report.plots=false",
               f"output_dir={out}", "--rounds", "1"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "optim.name=adamw train.lr=1e-3" in table and "samples/s" in table
    result = json.loads((out / "bench.json").read_text())
    by = {r["variant"]: r for r in result["rows"]}
    ok_a, ok_s = by["optim.name=adamw train.lr=1e-3"], by["optim.name=sgd train.lr=1e-3"]
    bad = by["optim.name=nonsense train.lr=1e-3"]
    assert ok_a["status"] == ok_s["status"] == "ok" and bad["status"] == "error" and "optim.name" in bad["error"]
    assert round(ok_a["optim_state_bytes_per_param"], 2) == 8.0 and ok_s["optim_state_bytes_per_param"] == 4.0
    assert ok_s["optim_state_bytes_ratio"] == pytest.approx(0.5, abs=1e-3)
    # two measured throughputs: the sgd row's ratio is its value over the baseline's (adamw, the first that ran)
    assert ok_s["samples_per_second_ratio"] == pytest.approx(ok_s["samples_per_second"] / ok_a["samples_per_second"],
                                                             abs=1e-4)
    assert f"{ok_s['samples_per_second']:.1f} ({ok_s['samples_per_second_ratio']:.2f}x)" in table
    assert ok_a["steps"] == 2 and ok_a["samples_per_second"] > 0 and ok_a["peak_memory_bytes"] > 50e6
    assert ok_a["eval_accuracy"] is not None and ok_a["baseline"] == ok_a["variant"]
    assert result["rounds"] == 1 and ok_a["runs"] == ok_s["runs"] == 1 and ok_s["speed_vs_baseline"] == "one round"
    assert "median of 1 interleaved round(s)" in table and "no spread measured" in table
    # each variant trained in its own process and folder
    for r in (ok_a, ok_s):
        folder = out / f"optim.name-{r['variant'].split()[0].split('=')[1]}__train.lr-1e-3"
        assert json.loads((folder / "summary.json").read_text())["optim"]["name"] in ("adamw", "sgd")
    with (out / "bench.csv").open() as f:
        csv_rows = list(csv.DictReader(f))
    assert [r["status"] for r in csv_rows] == ["ok", "ok", "error"]
    assert (out / "bench.png").stat().st_size > 5000


def test_two_rounds_give_each_variant_its_median_and_spread(tmp_path, tiny_bert):
    """The table of two interleaved rounds of a 2x1 sweep, from the summaries of real runs (trained here: a process
    each would pay its imports again): each row the median of its two rounds with their min-max, and whether the
    sgd row's speed differs from the baseline's beyond that spread."""
    from leantrain import train

    data = write_rows(tmp_path / "train.csv", alternating_rows(48, max_repeat=4))
    variants = make_variants(parse_sweeps(["optim.name=adamw,sgd", "train.lr=1e-3"]))
    for r in range(2):
        for v in variants:
            folder = tmp_path / v.slug / f"run{r + 1}"
            train(None, [f"model.name={tiny_bert}", f"data.train={data}", "train.max_steps=2", "train.batch_size=16",
                         "report.plots=false", "report.progress=none", *v.overrides, f"output_dir={folder}"])
            v.summaries.append(json.loads((folder / "summary.json").read_text()))
    result = result_of(variants, "leantrain bench", tmp_path, 2)
    ok_a, ok_s = result["rows"]
    table = bench_report.format_table(result["rows"])
    assert result["rounds"] == 2 and ok_a["runs"] == 2 and len(ok_a["samples_per_second_runs"]) == 2
    assert ok_a["samples_per_second_runs"] == [s["train"]["samples_per_second"] for s in variants[0].summaries]
    assert ok_a["samples_per_second"] == pytest.approx(sum(ok_a["samples_per_second_runs"]) / 2)  # median of 2
    assert ok_a["samples_per_second_min"] <= ok_a["samples_per_second"] <= ok_a["samples_per_second_max"]
    assert ok_a["speed_vs_baseline"] == "baseline" and ok_s["status"] == "ok" and ok_s["runs"] == 2
    assert ok_s["speed_vs_baseline"] in ("within noise", "faster", "slower") and "median of 2" in table


def test_a_failing_training_process_is_reported_with_its_error(tmp_path):
    import sys

    from leantrain.commands.bench import run_once

    cmd = [sys.executable, "-c", "import sys; print('loading'); print('leantrain: error: optim.name=adamw8bit needs "
           "bitsandbytes'); print('  - a detail'); sys.exit(2)"]
    summary, error = run_once(cmd, tmp_path / "v", timeout=60)
    assert summary is None and error.startswith("exit status 2: optim.name=adamw8bit needs bitsandbytes")
    assert "a detail" in error and (tmp_path / "v" / "train.log").is_file()
