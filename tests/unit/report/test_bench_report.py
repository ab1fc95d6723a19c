"""The bench's table from a fabricated result: ratios to the first variant that ran, and how they are rendered."""

from leantrain.report.bench_report import add_ratios, format_table


def _rows() -> list[dict]:
    def ok(variant, sps, tps, mem, state, per_param, loss, acc):
        return {"variant": variant, "status": "ok", "samples_per_second": sps, "tokens_per_second": tps,
                "peak_memory_bytes": mem, "optim_state_bytes": state, "optim_state_bytes_per_param": per_param,
                "eval_loss": loss, "eval_accuracy": acc, "runs": 3,
                "samples_per_second_min": sps * 0.9, "samples_per_second_max": sps * 1.1}

    return [{"variant": "optim.name=lion", "status": "error", "error": "optim.name=lion needs lion-pytorch"},
            ok("optim.name=adamw", 200.0, 5000.0, 400e6, 8e6, 8.0, 0.5, 0.8),
            ok("optim.name=sgd", 300.0, 6000.0, 300e6, 4e6, 4.0, 0.6, None)]


def test_ratios_are_to_the_first_variant_that_ran():
    lion, adamw, sgd = add_ratios(_rows())
    assert lion["baseline"] == adamw["baseline"] == sgd["baseline"] == "optim.name=adamw"  # lion failed
    assert (sgd["samples_per_second_ratio"], sgd["tokens_per_second_ratio"], sgd["peak_memory_bytes_ratio"],
            sgd["optim_state_bytes_ratio"], sgd["eval_loss_ratio"]) == (1.5, 1.2, 0.75, 0.5, 1.2)
    assert sgd["eval_accuracy_ratio"] is None  # not measured: no ratio
    assert all(lion[f"{k}_ratio"] is None for k in ("samples_per_second", "peak_memory_bytes", "eval_loss"))


def test_table_renders_values_with_their_ratios_and_the_errors():
    lines = format_table(add_ratios(_rows())).splitlines()
    assert lines[0].split()[:3] == ["variant", "status", "samples/s"]
    sgd = next(line for line in lines if line.startswith("optim.name=sgd"))
    for cell in ("300.0 (1.50x)", "270.0-330.0", "6000 (1.20x)", "300 (0.75x)", "4.0 (0.50x)", "4.00", "0.6000 (1.20x)"):
        assert cell in sgd, (cell, sgd)
    assert sgd.split()[-1] == "-"  # eval accuracy not measured
    lion = next(line for line in lines if line.startswith("optim.name=lion"))
    assert lion.split()[1:3] == ["error", "-"]
    assert "ratios (x) are to the baseline: optim.name=adamw" in lines
    assert lines[-1] == "error in optim.name=lion: optim.name=lion needs lion-pytorch"
