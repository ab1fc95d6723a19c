"""`leantrain plan` ranks speed only beyond the measured spread: "within noise" otherwise (fabricated timings, plus
the cheap step timing on a tiny model)."""

import io

from leantrain.perf import memory_model as planner
from leantrain.perf.noise import rank_by_speed


def _row(name, sps, lo, hi, ckpt=False):
    return {"name": name, "samples_per_second": sps, "samples_per_second_range": [lo, hi],
            "gradient_checkpointing": ckpt}


def test_checkpointing_is_not_ranked_fastest_on_noise():
    rows = [_row("plain", 100.0, 80.0, 125.0), _row("ckpt", 104.0, 70.0, 130.0, ckpt=True), _row("slow", 40, 35, 45)]
    ranked = rank_by_speed(rows, prefer=lambda r: int(r["gradient_checkpointing"]))
    assert [r["name"] for r in ranked] == ["plain", "ckpt", "slow"]  # tied: the fewest changes first
    assert [r["speed"] for r in ranked] == ["within noise", "within noise", "slower"]
    assert not any(r["speed"] == "fastest" for r in ranked)


def test_a_difference_beyond_the_spread_is_ranked():
    ranked = rank_by_speed([_row("a", 100.0, 95.0, 105.0), _row("b", 150.0, 140.0, 160.0), _row("c", 60, 50, 70)])
    assert [(r["name"], r["speed"]) for r in ranked] == [("b", "fastest"), ("a", "slower"), ("c", "slower")]


def test_calibration_predicts_a_range_from_its_timed_repeats():
    cal = planner.Calibration("fp32", False, 16, (1, 8), (100, 800), (1000, 8000), (0.1, 0.4),
                              big_seconds=(0.3, 0.4, 0.6), time_sizes=(1, 4))
    assert cal.seconds_at(4) == 0.4 and cal.seconds_at(7) > 0.4
    lo, hi = cal.seconds_range_at(4)
    assert abs(lo - 0.3) < 1e-9 and abs(hi - 0.6) < 1e-9
    assert planner.Calibration("fp32", False, 16, (1, 8), (1, 8), (1, 8), (0.1, 0.4)).seconds_range_at(8) == (0.4, 0.4)


def test_plan_text_says_within_noise_instead_of_fastest():
    from leantrain.commands.plan import print_plan

    recs = [{**_row("x", 5.2, 4.5, 8.4), "speed": "within noise", "peak_bytes": 2**30, "overrides": ["a=1"]},
            {**_row("y", 5.1, 4.5, 8.2), "speed": "within noise", "peak_bytes": 2**30, "overrides": ["a=2"]}]
    result = {"parameters": 1e6, "device": "cpu", "nproc": 1, "strategy": "none", "micro_batch_size": 8,
              "accumulation_steps": 1, "seq_len": 16, "precision": "fp32", "gradient_checkpointing": False,
              "optimizer": "adamw", "lines": {"total": 100}, "budget_bytes": 2**31, "budget_source": "--memory",
              "fits": True, "need_bytes": 120, "options_fitting": 2, "options_considered": 2, "global_batch": 8,
              "recommendations": recs, "within_noise_of_fastest": 2}
    out = io.StringIO()
    print_plan(None, result, out)
    text = out.getvalue()
    assert "5.2 samples/s (4.5-8.4)  within noise" in text
    assert "none of them is shown to be the fastest" in text


def test_optimizer_step_is_timed_repeatedly_on_one_block(tiny_bert, monkeypatch):
    import transformers

    from leantrain.config import OptimConfig

    model = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    calls = []
    orig = planner.build_optimizer

    def spy(target, cfg, lr):
        calls.append(sum(p.numel() for p in target.parameters()))
        return orig(target, cfg, lr)

    monkeypatch.setattr(planner, "build_optimizer", spy)
    times = planner.measure_step_times(model, OptimConfig(name="adamw"))
    assert len(times) == planner.TIME_REPEATS and all(t > 0 for t in times)
    assert calls and calls[0] < sum(p.numel() for p in model.parameters()) / 3  # one layer, not the whole model


def test_auto_micro_batch_measures_the_size_it_would_extrapolate_to(monkeypatch):
    """A calibration at (1, 2) (a short pass on a busy machine) extrapolates activations linearly, which is what
    under-predicted the peak (1.213 GiB measured under a 1.2 GiB budget): before choosing a larger size, auto
    measures at that size and drops to a smaller one when the measurement does not fit."""
    from leantrain.config import resolve
    from leantrain.perf import auto_micro_batch as plan

    MiB = 2**20
    facts = planner.ModelFacts(parameter_bytes=100 * MiB, gradient_bytes=100 * MiB, trainable=25 * MiB,
                               cast_bytes=0, largest_block_bytes=10 * MiB, framework_bytes=500 * MiB)
    calls = []

    def fake_calibrate(model, seq_len, precision, ckpt, per_process, seconds=None, timing=True, size=None, *,
                       task=None):
        calls.append(size)
        per_example = 20 * MiB if size is None else 60 * MiB  # the real growth is 3x the short passes' slope
        big = size or 2
        return planner.Calibration(precision, ckpt, seq_len, (1, big), (per_example, big * per_example),
                                   (100 * MiB + per_example, 100 * MiB + big * per_example), (0.1, 0.2))

    monkeypatch.setattr(planner, "calibrate", fake_calibrate)
    monkeypatch.setattr(planner, "meta_state_bytes", lambda model, optim: 200 * MiB)
    cfg = resolve(None, ["train.batch_size=16"])
    micro, why = plan.fit_micro_batch(cfg, None, None, 16, 64, budget=2000 * MiB, facts=facts)
    assert calls[0] is None and 16 in calls  # extrapolated 16 fitted on paper, so 16 was measured
    lines = planner.lines(facts, fake_calibrate(None, 64, "fp32", False, 16, size=micro), micro, 200 * MiB)
    assert plan.need_bytes(lines) <= 2000 * MiB and micro < 16


# Measured on this project's CPU machine (MiniLM, demo data, 35 tokens, bf16, 6 steps, plots on): the step's
# predicted lines (`leantrain plan --breakdown-only --json`) and the whole run's peak_memory_bytes.
MEASURED = [  # (micro, framework line, predicted total, measured whole-run peak, efficiency.cpu_allocator)
    (8, 561_450_996, 1_026_294_204, 1_187_454_976, "reuse"),
    (16, 560_685_044, 1_049_117_116, 1_202_195_456, "reuse"),
    (16, 560_685_044, 1_049_117_116, 1_129_600_000, "system"),
]


def test_the_margin_covers_every_measured_whole_run_peak():
    from leantrain.perf.auto_micro_batch import MARGIN, need_bytes

    old_misses = 0
    for micro, framework, total, peak, allocator in MEASURED:
        lines = {"framework_overhead": framework, "total": total}
        assert need_bytes(lines) >= peak, (micro, allocator)
        old_misses += total + MARGIN * (total - framework) < peak  # the 25% margin alone
    assert old_misses >= 1
