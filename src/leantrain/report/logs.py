"""Run folder writers: metrics.jsonl (one object per logged step and per evaluation), completions.jsonl (what a
method that makes its own batches generated, a few records per logging step), summary.json, config.yaml.

Only the main process writes; the others get a writer that does nothing. Every record also goes to the run's
trackers (``report.trackers``, through Accelerate, which logs on the main process only): its numbers as scalars
(``tracker_values``), its rows (a samples record's continuations, completions.jsonl's records) as a table where the
tracker takes tables (``TABLE_TRACKERS``: trackio).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

COMPLETIONS = "completions.jsonl"  # beside metrics.jsonl: a method's sample records (``StepBatches.samples``)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write JSON atomically (temp file + rename), so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(data), indent=2) + "\n")
    os.replace(tmp, path)
    return path


class MetricsLog:
    def __init__(self, path: str | os.PathLike | None, accelerator=None, prior: list[dict[str, Any]] | None = None):
        """``prior``: records of the run so far (a resumed run), written back first; the sample records of its steps
        after the last of them (a resumed run's completions.jsonl past its checkpoint) are dropped."""
        self.path = Path(path) if path else None
        self.accelerator = accelerator
        self.records: list[dict[str, Any]] = list(prior or [])
        if self.path:
            self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))
            samples = self.samples_path
            if samples.exists():
                last = max((r.get("step", 0) for r in self.records if r.get("type") == "train"), default=0)
                kept = [r for r in read_metrics(samples) if r.get("step", 0) <= last]
                samples.write_text("".join(json.dumps(r) + "\n" for r in kept))

    @property
    def samples_path(self) -> Path:
        return self.path.with_name(COMPLETIONS)

    def write_samples(self, step: int, samples) -> None:  # noqa: ANN001 - JSON-able records, or a callable
        """A method's sample records of ``step`` (``StepBatches.samples``: the records, or a callable making them,
        called here only: on the main process at a logging step), appended to completions.jsonl; the trackers that
        take tables get them as the table ``completions``."""
        if not self.path:
            return
        samples = samples() if callable(samples) else samples
        if not samples:
            return
        rows = [_clean({"step": step, **dict(r)}) for r in samples]
        with self.samples_path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        self._log_table(Path(COMPLETIONS).stem, rows, step)

    def write(self, record: dict[str, Any]) -> None:
        record = _clean(record)
        self.records.append(record)
        if self.path:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        self.to_trackers(record)
        kind = str(record.get("type", "train"))
        for key, rows in record.items():  # a samples record's continuations: the table ``samples``
            if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
                self._log_table(kind if key == kind else f"{kind}/{key}", rows, record.get("step"))

    def to_trackers(self, record: dict[str, Any]) -> None:
        """``record``'s numbers to the trackers only (not metrics.jsonl), e.g. the run's time split so far."""
        values = tracker_values(record)  # none for a samples record: its rows go to a table
        if values and self.accelerator is not None and self.accelerator.trackers:
            self.accelerator.log(values, step=record.get("step"))

    def _log_table(self, name: str, rows: list[dict[str, Any]], step: int | None) -> None:
        """``rows`` as the table ``name`` at ``step``, to each tracker that takes tables (on the main process only,
        as Accelerate logs). A nested mapping (GRPO's ``rewards``) becomes columns ``rewards.<name>``."""
        if self.accelerator is None or not getattr(self.accelerator, "is_main_process", True):
            return
        for tracker in self.accelerator.trackers:
            table = TABLE_TRACKERS.get(getattr(tracker, "name", None))
            if table is not None:
                tracker.log({name: table([table_row(r) for r in rows])}, step=step)


def tracker_values(record: dict[str, Any]) -> dict[str, float]:
    """A metrics record as tracker tags, one scheme for every kind: ``<type>/<name>`` (``train/loss``,
    ``eval/accuracy``, ``eval/loop_seconds``); a record key that already names its type (``eval.accuracy``) loses
    that prefix rather than doubling it."""
    kind = str(record.get("type", "train"))
    out = {}
    for k, v in record.items():
        if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        name = k.removeprefix(f"{kind}.").removeprefix(f"{kind}/")
        out[f"{kind}/{name}"] = v
    return out


def table_row(row: dict[str, Any]) -> dict[str, Any]:
    """A record as one table row: scalars and text as they are, a nested mapping flattened to ``<key>.<name>``
    columns, any other value (a list) as JSON text."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(table_row({f"{k}.{name}": x for name, x in v.items()}))
        elif v is None or isinstance(v, (str, int, float)):
            out[k] = v
        else:
            out[k] = json.dumps(v)
    return out


def _trackio_table(rows: list[dict[str, Any]]):
    import trackio

    return trackio.Table(data=rows)


TABLE_TRACKERS = {"trackio": _trackio_table}  # Accelerate tracker name -> rows -> the value its ``log`` takes


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
