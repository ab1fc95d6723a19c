"""`leantrain bench`: short trials of one config across a sweep of key=value lists, side by side.

Each variant (one point of the cartesian product of the sweeps) is validated on its own: a bad key or value
becomes a row with its error, not a crash of the sweep. Each valid variant trains in a fresh
``python -m leantrain train`` process, so its peak memory is its own. Over ``--rounds N`` (default 3) the runs are
interleaved (v1, v2, ..., v1, v2, ...) so that a slow patch on a shared machine does not land on one variant alone;
the table shows each variant's median with its min-max spread, and calls a difference "within noise" when the
spreads overlap.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from leantrain.config import resolve
from leantrain.errors import ConfigError, UserError
from leantrain.report import bench_report
from leantrain.report.final_line import speed_text


@dataclass
class Variant:
    overrides: list[str]  # this variant's sweep values, e.g. ["optim.name=sgd", "efficiency.precision=bf16"]
    error: str | None = None  # why it did not run (validation or the training process)
    summaries: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return " ".join(self.overrides) or "base"

    @property
    def slug(self) -> str:
        text = "__".join(o.replace("=", "-") for o in self.overrides) or "base"
        return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:120]


def split_values(text: str) -> list[str]:
    """``a,b,[1,2]`` -> ``["a", "b", "[1,2]"]``: commas inside brackets or braces belong to the value."""
    values, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            values.append(cur.strip())
            cur = ""
        else:
            cur += ch
    values.append(cur.strip())
    return values


def parse_sweeps(sweeps: list[str]) -> list[tuple[str, list[str]]]:
    """``["optim.name=adamw,sgd", ...]`` -> ``[("optim.name", ["adamw", "sgd"]), ...]``; one key per --sweep."""
    parsed, seen = [], set()
    for text in sweeps:
        key, sep, raw = text.partition("=")
        key = key.strip()
        values = split_values(raw) if sep else []
        if not key or not values or any(v == "" for v in values):
            raise UserError(f"--sweep {text!r}: expected KEY=V1,V2,... (e.g. --sweep optim.name=adamw,sgd)")
        if key in seen:
            raise UserError(f"--sweep {key} is given twice; list all its values in one --sweep")
        seen.add(key)
        parsed.append((key, values))
    return parsed


def make_variants(sweeps: list[tuple[str, list[str]]]) -> list[Variant]:
    keys = [k for k, _ in sweeps]
    return [Variant([f"{k}={v}" for k, v in zip(keys, combo)]) for combo in itertools.product(*(v for _, v in sweeps))]


def validate(variant: Variant, source: str | None, overrides: list[str]) -> None:
    try:
        resolve(source, [*overrides, *variant.overrides])
    except ConfigError as e:
        variant.error = " ".join(str(e).split())


def train_command(source: str | None, overrides: list[str], variant: Variant, out: Path) -> list[str]:
    return [sys.executable, "-m", "leantrain", "train", *([source] if source else []), "report.progress=plain",
            *overrides, *variant.overrides, f"output_dir={out}"]


def run_once(cmd: list[str], out: Path, timeout: float | None) -> tuple[dict | None, str | None]:
    """One training process; its output goes to out/train.log. Returns (summary, None) or (None, error)."""
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "train.log"
    with log_path.open("w") as log_file:
        try:
            proc = subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout:g} s (see {log_path})"
    summary_path = out / "summary.json"
    if proc.returncode == 0 and summary_path.is_file():
        return json.loads(summary_path.read_text()), None
    return None, f"exit status {proc.returncode}: {_last_error(log_path)}"


def _last_error(log_path: Path) -> str:
    lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    for i, line in enumerate(lines):  # a leantrain error with its listed problems, else the traceback's last line
        if line.startswith("leantrain: error:"):
            return " ".join([line.removeprefix("leantrain: error:").strip(), *lines[i + 1:i + 6]])[:500]
    return (lines[-1] if lines else "no output")[:500]


DEFAULT_ROUNDS = 3


def run_bench(source: str | None, overrides: list[str], sweeps: list[str], *, rounds: int = DEFAULT_ROUNDS,
              repeat: int | None = None, timeout: float | None = None, echo=print) -> dict:
    """Validate, run (interleaved over ``rounds`` rounds; ``repeat`` is the old name), tabulate and write
    bench.csv/json/png. Returns the result dict (also in bench.json)."""
    repeat = rounds if repeat is None else repeat
    if repeat < 1:
        raise UserError(f"--rounds must be at least 1 (got {repeat})")
    base = resolve(source, overrides)  # a bad base config fails the whole command, before anything runs
    out = Path(base.output_dir or Path("runs") / time.strftime("bench-%Y%m%d-%H%M%S"))
    overrides = [o for o in overrides if not o.split("=", 1)[0].strip() == "output_dir"]
    variants = make_variants(parse_sweeps(sweeps))
    for v in variants:
        validate(v, source, overrides)
    runnable = [v for v in variants if v.error is None]
    echo(f"bench: {len(variants)} variant(s), {len(runnable)} valid, {repeat} round(s) -> {out}", file=sys.stderr)
    for r in range(repeat):
        for v in runnable:
            folder = out / v.slug / (f"run{r + 1}" if repeat > 1 else "")
            t0 = time.perf_counter()
            summary, error = run_once(train_command(source, overrides, v, folder), folder, timeout)
            (v.summaries.append(summary) if summary else v.failures.append(error))
            status = f"ok, {speed_text(summary['train'])}" if summary else f"FAILED: {error}"
            echo(f"  [{r + 1}/{repeat}] {v.label}: {status} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    for v in runnable:
        if not v.summaries:
            v.error = v.failures[0]
    command = " ".join(["leantrain", "bench", *([source] if source else []), *overrides,
                        *(f"--sweep {s}" for s in sweeps), f"--rounds {repeat}"])
    result = result_of(variants, command, out, repeat)
    out.mkdir(parents=True, exist_ok=True)
    bench_report.write_all(result, out)
    echo(bench_report.format_table(result["rows"]))
    echo(f"wrote {out / 'bench.csv'}, {out / 'bench.json'}, {out / 'bench.png'}", file=sys.stderr)
    return result


def result_of(variants: list[Variant], command: str, out: Path, rounds: int) -> dict:
    """What bench.json holds: a row per variant (its medians over the rounds that ran, ratios to the baseline, whether
    its speed differs from the baseline's beyond the spread) and how it was measured."""
    rows = bench_report.add_noise(bench_report.add_ratios([row_of(v) for v in variants]))
    return {"command": command, "output_dir": str(out), "rounds": rounds, "repeat": rounds, "order": "interleaved",
            "rows": rows}


def row_of(v: Variant) -> dict:
    """One table row: medians over the rounds that ran (throughput also min, max and each round's value); eval
    metrics and state from the last run."""
    row = {"variant": v.label, "overrides": v.overrides, "status": "ok" if v.summaries else "error", "error": v.error, "runs": len(v.summaries),
           "failed_runs": len(v.failures)}
    if not v.summaries:
        return row
    last = v.summaries[-1]
    med = lambda f: statistics.median(f(s) for s in v.summaries)  # noqa: E731
    tr = lambda s: s["train"]  # noqa: E731
    memory_key = "cuda_max_allocated_bytes" if "cuda_max_allocated_bytes" in tr(last) else "peak_memory_bytes"
    optim = last.get("optim") or {}
    for key in ("samples_per_second", "tokens_per_second"):
        values = [tr(s)[key] for s in v.summaries]
        row[f"{key}_runs"] = values
        row[f"{key}_min"], row[f"{key}_max"] = min(values), max(values)
    row.update({
        "samples_per_second": med(lambda s: tr(s)["samples_per_second"]),
        "tokens_per_second": med(lambda s: tr(s)["tokens_per_second"]),
        "peak_memory_bytes": int(med(lambda s: tr(s)[memory_key])),
        "memory_kind": "cuda_allocated" if memory_key.startswith("cuda") else "rss",
        "optim_state_bytes": optim.get("state_bytes"),
        "optim_state_bytes_per_param": optim.get("state_bytes_per_param"),
        "eval_loss": (last.get("eval") or {}).get("loss"),
        "eval_accuracy": (last.get("eval") or {}).get("accuracy"),
        "steps": tr(last)["steps"],
        "device": (last.get("device") or {}).get("type"),
    })
    return row


def bench_command(source: str | None, overrides: list[str], sweeps: list[str], *, rounds: int = DEFAULT_ROUNDS,
                  timeout: float | None = None) -> int:
    """``leantrain bench``: exit status 0 when at least one variant ran."""
    result = run_bench(source, overrides, sweeps, rounds=rounds, timeout=timeout)
    return 0 if any(r["status"] == "ok" for r in result["rows"]) else 1
