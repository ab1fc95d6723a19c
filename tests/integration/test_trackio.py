"""report.trackers=[trackio] for real (issue 52): trackio installed, offline, its SQLite store under the TRACKIO_DIR
tests/conftest.py gives this process. A 2-step GRPO run and a 2-step causal-LM run (``leantrain train`` on the
command line, with a sample prompt) are read back from the store: each train record's numbers as they are in
metrics.jsonl, completions.jsonl's rows and the sample continuations as tables, the run's time split so far at each logging step."""

from __future__ import annotations

import pytest

from leantrain import train
from leantrain.cli import main
from leantrain.report.logs import read_metrics, table_row, tracker_values
from tests.helpers import TINY_LLAMA, grpo_args, lm_documents, make_tiny_lm_tokenizer, write_grpo_files

pytest.importorskip("trackio")


def _trackio_logs(run_name: str) -> list[dict]:
    """The run's logs in trackio's store (project leantrain), read with trackio's own reader."""
    from trackio.sqlite_storage import SQLiteStorage

    assert run_name in SQLiteStorage.get_runs("leantrain")
    return SQLiteStorage.get_logs("leantrain", run=run_name)


def _tables(logs: list[dict], name: str) -> list[tuple[int, list[dict]]]:
    return [(log["step"], log[name]["_value"]) for log in logs if isinstance(log.get(name), dict)]


def _scalars(logs: list[dict], prefix: str) -> dict[int, dict]:
    """step -> the logged numbers whose tag starts with ``prefix`` (``train/``)."""
    out: dict[int, dict] = {}
    for log in logs:
        values = {k: v for k, v in log.items() if k.startswith(prefix)}
        if values:
            out.setdefault(log["step"], {}).update(values)
    return out


def test_a_grpo_run_logs_its_step_metrics_completions_and_time_split_to_trackio(tmp_path):
    root = write_grpo_files(tmp_path)
    out = tmp_path / "trackio-grpo"
    summary = train(None, grpo_args(root, out, "train.max_steps=2", "report.trackers=[trackio]"))
    logs = _trackio_logs(out.name)

    records = read_metrics(out / "metrics.jsonl")
    train_rows = [r for r in records if r["type"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert _scalars(logs, "train/") == {r["step"]: tracker_values(r) for r in train_rows}
    assert {"train/loss", "train/reward", "train/rewards/short/mean", "train/tokens_per_second"} <= set(
        _scalars(logs, "train/")[2])
    evals = [r for r in records if r["type"] == "eval"]
    assert _scalars(logs, "eval/") == {r["step"]: tracker_values(r) for r in evals}

    completions = read_metrics(out / "completions.jsonl")
    assert completions  # grpo.log_completions rows at the rollout's first step
    tables = _tables(logs, "completions")
    assert [row for _, rows in tables for row in rows] == [table_row(r) for r in completions]
    assert [step for step, _ in tables] == sorted({r["step"] for r in completions})
    assert {"prompt", "completion", "reward", "rewards.has_digit", "rewards.short"} <= set(tables[0][1][0])

    split = summary["train"]["time_split_seconds"]
    assert {"data", "batches", "compute"} <= set(split)
    splits = _scalars(logs, "time_split_seconds/")  # so far, at each logging step; the run's own at its last
    assert sorted(splits) == [1, 2] and splits[1]["time_split_seconds/compute"] < splits[2]["time_split_seconds/compute"]
    assert splits[2] == {f"time_split_seconds/{k}": v for k, v in split.items()}


def test_leantrain_train_logs_a_causal_lms_sample_continuations_to_trackio(tmp_path):
    tok = make_tiny_lm_tokenizer(tmp_path / "tok")
    (tmp_path / "train.txt").write_text("\n\n".join(lm_documents(24, 0)))
    out = tmp_path / "trackio-clm"
    assert main(["train", *TINY_LLAMA, f"model.tokenizer={tok}", "model.task=causal-lm",
                 f"data.train={tmp_path / 'train.txt'}", "data.block_size=16", "data.document_separator=\\n\\n",
                 "train.batch_size=4", "train.max_steps=2", "train.log_every_steps=1", "efficiency.precision=fp32",
                 "report.sample_prompts=[ba be]", "report.sample_max_new_tokens=3", "report.trackers=[trackio]",
                 "report.plots=false", "report.progress=none", f"output_dir={out}"]) == 0
    logs = _trackio_logs(out.name)

    records = read_metrics(out / "metrics.jsonl")
    samples = [(r["step"], r["samples"]) for r in records if r["type"] == "samples"]
    assert [step for step, _ in samples] == [0, 2]  # before the first step and at the final evaluation
    assert _tables(logs, "samples") == samples
    assert samples[0][1][0]["prompt"] == "ba be"
    assert _scalars(logs, "train/") == {r["step"]: tracker_values(r) for r in records if r["type"] == "train"}
