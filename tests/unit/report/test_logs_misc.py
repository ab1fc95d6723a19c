"""Logs that read well outside a terminal: no datasets progress bars, one `batch:` line with auto, a chart title
that fits, one tracker tag scheme."""

import pytest

from tests.helpers import write_rows
from leantrain import train
from leantrain.report.logs import read_metrics


def test_tracker_tags_use_one_scheme_for_train_and_eval():
    from leantrain.report.logs import MetricsLog

    logged = []

    class FakeAccelerator:
        trackers = [object()]

        def log(self, values, step=None):
            logged.append((step, values))

    m = MetricsLog(None, FakeAccelerator())
    m.write({"type": "train", "step": 2, "loss": 0.5, "lr": 1e-3, "skipped": False})
    m.write({"type": "eval", "step": 2, "loop_seconds": 1.5, "eval.accuracy": 0.75, "eval.loss": 0.4})
    assert logged == [(2, {"train/loss": 0.5, "train/lr": 1e-3}),
                      (2, {"eval/loop_seconds": 1.5, "eval/accuracy": 0.75, "eval/loss": 0.4})]


def test_rows_go_as_tables_to_the_trackers_that_take_them_on_the_main_process_only(tmp_path, monkeypatch):
    """A samples record's continuations and completions.jsonl's records (a nested ``rewards`` flattened to columns)
    reach a table-taking tracker (trackio) as tables; a tracker without tables gets the scalars only, and a record
    with no scalars (samples) logs none; another process writes nothing."""
    import leantrain.report.logs as logs

    monkeypatch.setitem(logs.TABLE_TRACKERS, "trackio", lambda rows: ("table", rows))
    logged, tables = [], []

    class Tracker:
        def __init__(self, name):
            self.name = name

        def log(self, values, step=None):
            tables.append((self.name, step, values))

    class FakeAccelerator:
        trackers = [Tracker("tensorboard"), Tracker("trackio")]
        is_main_process = True

        def log(self, values, step=None):
            logged.append((step, values))

    m = logs.MetricsLog(tmp_path / "metrics.jsonl", FakeAccelerator())
    m.write({"type": "samples", "step": 0, "samples": [{"prompt": "Once", "continuation": " upon"}]})
    m.write_samples(2, [{"prompt": "1+1?", "completion": "2", "reward": 1.5, "rewards": {"digit": 1.0, "short": 0.5}}])
    m.to_trackers({"type": "time_split_seconds", "step": 2, "data": 0.25, "compute": 1.0})
    assert tables == [("trackio", 0, {"samples": ("table", [{"prompt": "Once", "continuation": " upon"}])}),
                      ("trackio", 2, {"completions": ("table", [{"step": 2, "prompt": "1+1?", "completion": "2",
                                                                  "reward": 1.5, "rewards.digit": 1.0,
                                                                  "rewards.short": 0.5}])})]
    assert logged == [(2, {"time_split_seconds/data": 0.25, "time_split_seconds/compute": 1.0})]
    assert read_metrics(tmp_path / "metrics.jsonl") == [m.records[0]]  # the time split: trackers only

    tables.clear()
    FakeAccelerator.is_main_process = False
    other = logs.MetricsLog(None, FakeAccelerator())
    other.write({"type": "samples", "step": 0, "samples": [{"prompt": "Once", "continuation": " upon"}]})
    other.write_samples(2, [{"completion": "2"}])
    assert tables == []


def test_datasets_progress_bars_are_off_when_output_is_not_a_terminal(monkeypatch):
    import datasets

    from leantrain.engine.devices.accelerator import setup_logging

    datasets.enable_progress_bars()
    try:
        setup_logging(True)  # under pytest, stdout and stderr are captured: not terminals
        assert not datasets.is_progress_bar_enabled()
    finally:
        datasets.enable_progress_bars()


@pytest.mark.parametrize("name, short", [
    ("/tmp/pytest-of-root/pytest-12/some-long-folder-name/with/many/parts/tiny-bert0", "tiny-bert0"),
    ("runs/emotion-2024-11-30/model", "emotion-2024-11-30/model"),
    ("sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"),
    ("bert-base-uncased", "bert-base-uncased"),
])
def test_short_model_name(name, short):
    from leantrain.report.plots import short_model_name

    assert short_model_name(name) == short
    assert len(short_model_name("/x/" + "a" * 200)) <= 48


def test_auto_micro_batch_prints_one_batch_line_and_the_plot_title_is_short(tmp_path, tiny_bert, capsys, monkeypatch):
    import leantrain.engine.artifacts as artifacts  # where the run's outputs call it

    titles = []
    real = artifacts.plot_loss_curve
    monkeypatch.setattr(artifacts, "plot_loss_curve", lambda records, path, title="": titles.append(title) or
                        real(records, path, title))
    rows = [{"text": ("good fine " if i % 2 else "bad poor ") * (1 + i % 3), "label": i % 2} for i in range(40)]
    data = write_rows(tmp_path / "train.csv", rows)
    train(None, [f"model.name={tiny_bert}", f"data.train={data}", "train.max_steps=2", "train.batch_size=8",
                 "train.micro_batch_size=auto", "efficiency.memory_budget=64GiB", f"output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    batch_lines = [line for line in err.splitlines() if line.startswith("batch:")]
    assert len(batch_lines) == 1, batch_lines
    assert titles == [f"{tiny_bert.name} — run"]


def test_a_resumed_log_keeps_the_samples_of_its_steps_only(tmp_path):
    """completions.jsonl beside metrics.jsonl: a method's sample records appended at logging steps; a resumed run
    (its records up to the checkpoint's step) drops the samples written after that step."""
    from leantrain.report.logs import MetricsLog, read_metrics

    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write_samples(2, [{"completion": "4", "reward": 1.0}, {"completion": "five", "reward": 0.0}])
    log.write_samples(3, [])  # nothing made: nothing written
    log.write_samples(4, [{"completion": "x", "reward": float("nan")}])
    assert [r["step"] for r in read_metrics(tmp_path / "completions.jsonl")] == [2, 2, 4]
    assert read_metrics(tmp_path / "completions.jsonl")[2]["reward"] == "nan"  # JSON has no NaN: written as text
    MetricsLog(tmp_path / "metrics.jsonl", prior=[{"type": "train", "step": 2, "loss": 0.1}])
    assert read_metrics(tmp_path / "completions.jsonl") == [{"step": 2, "completion": "4", "reward": 1.0},
                                                            {"step": 2, "completion": "five", "reward": 0.0}]
