"""`leantrain plan` ranks speed only beyond the measured spread: "within noise" otherwise (fabricated timings, plus
the cheap step timing on a tiny model)."""

import io

from leantrain.perf import planner
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
    from leantrain.perf.plan_command import print_plan

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


def test_optimizer_step_is_timed_repeatedly_on_one_block(tiny_bert):
    import transformers

    from leantrain.config import OptimConfig

    model = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    calls = []
    real = planner.build_optimizer if hasattr(planner, "build_optimizer") else None
    import leantrain.optim as optim

    orig = optim.build_optimizer

    def spy(target, cfg, lr):
        calls.append(sum(p.numel() for p in target.parameters()))
        return orig(target, cfg, lr)

    optim.build_optimizer = spy
    try:
        times = planner.measure_step_times(model, OptimConfig(name="adamw"))
    finally:
        optim.build_optimizer = orig
    assert real is None and len(times) == planner.TIME_REPEATS and all(t > 0 for t in times)
    assert calls and calls[0] < sum(p.numel() for p in model.parameters()) / 3  # one layer, not the whole model
