"""The bench's outputs: a terminal table, bench.csv, bench.json and bench.png (peak memory vs throughput).

Throughput is the median over the interleaved rounds with its min-max spread; a variant whose spread overlaps the
baseline's is "within noise" rather than faster or slower."""

from __future__ import annotations

import csv
from pathlib import Path

from leantrain.report.logs import write_json

RATIO_KEYS = ["samples_per_second", "tokens_per_second", "peak_memory_bytes", "optim_state_bytes", "eval_loss",
              "eval_accuracy"]
CSV_COLUMNS = ["variant", "status", "runs", "failed_runs", "samples_per_second", "samples_per_second_min",
               "samples_per_second_max", "speed_vs_baseline", "tokens_per_second", "tokens_per_second_min",
               "tokens_per_second_max",
               "peak_memory_bytes", "memory_kind", "optim_state_bytes", "optim_state_bytes_per_param", "eval_loss",
               "eval_accuracy", "steps", "device", *(f"{k}_ratio" for k in RATIO_KEYS), "error"]


def add_ratios(rows: list[dict]) -> list[dict]:
    """Each measured value also as a ratio to the first variant that ran (the baseline)."""
    base = next((r for r in rows if r["status"] == "ok"), None)
    for r in rows:
        r["baseline"] = base["variant"] if base else None
        for k in RATIO_KEYS:
            num, den = r.get(k), (base or {}).get(k)
            r[f"{k}_ratio"] = round(num / den, 4) if num is not None and den else None
    return rows


def overlaps(a: dict, b: dict, key: str = "samples_per_second") -> bool:
    """Whether two rows' measured ranges (min-max over the rounds) of ``key`` overlap."""
    return a[f"{key}_min"] <= b[f"{key}_max"] and b[f"{key}_min"] <= a[f"{key}_max"]


def add_noise(rows: list[dict]) -> list[dict]:
    """``speed_vs_baseline`` per row that ran: ``baseline``, ``faster`` / ``slower`` (the min-max ranges of
    samples/s do not overlap), ``within noise`` (they overlap) or ``one round`` (no spread was measured)."""
    base = next((r for r in rows if r["status"] == "ok"), None)
    for r in rows:
        if r["status"] != "ok" or base is None or "samples_per_second_min" not in r:
            r["speed_vs_baseline"] = None
        elif r is base:
            r["speed_vs_baseline"] = "baseline"
        elif r["runs"] < 2 or base["runs"] < 2:
            r["speed_vs_baseline"] = "one round"
        elif overlaps(r, base):
            r["speed_vs_baseline"] = "within noise"
        else:
            r["speed_vs_baseline"] = "faster" if r["samples_per_second"] > base["samples_per_second"] else "slower"
    return rows


def write_all(result: dict, out: Path) -> None:
    rows = result["rows"]
    write_json(out / "bench.json", result)
    with (out / "bench.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    plot(rows, out / "bench.png", rounds=result.get("rounds"))


def _num(value, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value / scale)


def _with_ratio(row: dict, key: str, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    ratio = row.get(f"{key}_ratio")
    return _num(row.get(key), scale, fmt) + ("" if ratio is None else f" ({ratio:.2f}x)")


def _spread(row: dict, key: str, fmt: str = "{:.1f}") -> str:
    lo, hi = row.get(f"{key}_min"), row.get(f"{key}_max")
    return "-" if lo is None or row.get("runs", 0) < 2 else f"{fmt.format(lo)}-{fmt.format(hi)}"


def format_table(rows: list[dict]) -> str:
    """Plain aligned text, one line per variant: medians over the rounds with their min-max spread, ratios to the
    baseline in brackets, and whether the speed difference is beyond the spread; notes and errors below."""
    head = ["variant", "status", "samples/s", "spread", "vs baseline", "tokens/s", "peak mem MB", "optim state MB",
            "B/param", "eval loss", "eval acc"]
    body = []
    for r in rows:
        body.append([r["variant"], r["status"], _with_ratio(r, "samples_per_second"), _spread(r, "samples_per_second"),
                     r.get("speed_vs_baseline") or "-",
                     _with_ratio(r, "tokens_per_second", fmt="{:.0f}"), _with_ratio(r, "peak_memory_bytes", 1e6, "{:.0f}"),
                     _with_ratio(r, "optim_state_bytes", 1e6), _num(r.get("optim_state_bytes_per_param"), fmt="{:.2f}"),
                     _with_ratio(r, "eval_loss", fmt="{:.4f}"), _with_ratio(r, "eval_accuracy", fmt="{:.4f}")])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    text = [line(head), line(["-" * w for w in widths]), *map(line, body)]
    base = rows[0].get("baseline") if rows else None
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        runs = sorted({r["runs"] for r in ok})
        text.append(f"samples/s and tokens/s: median of {'/'.join(map(str, runs))} interleaved round(s) per variant; "
                    "spread: min-max over the rounds")
    if base:
        text.append(f"ratios (x) are to the baseline: {base}")
    noise = [r["variant"] for r in ok if r.get("speed_vs_baseline") == "within noise"]
    if noise:
        text.append(f"within noise: the samples/s spread of {', '.join(noise)} overlaps the baseline's, so the "
                    "difference in speed is not measured to be real (more rounds or longer runs narrow the spread)")
    if any(r.get("speed_vs_baseline") == "one round" for r in ok):
        text.append("one round: no spread measured, a difference in speed may be noise (use --rounds 3 or more)")
    text += [f"error in {r['variant']}: {r['error']}" for r in rows if r.get("error")]
    return "\n".join(text)


def short_labels(rows: list[dict]) -> list[str]:
    """Each variant's overrides without those every variant shares (``train.lr=1e-3`` in a 2x1 sweep)."""
    common = set.intersection(*(set(r.get("overrides") or []) for r in rows)) if len(rows) > 1 else set()
    return [" ".join(o for o in r.get("overrides") or [] if o not in common) or r["variant"] for r in rows]


def chart_title(rows: list[dict], rounds: int | None = None) -> str:
    """What the chart shows and how often it was measured."""
    ok = [r for r in rows if r["status"] == "ok"]
    failed = len(rows) - len(ok)
    runs = sorted({r["runs"] for r in ok})
    measured = (f"samples/s: median of {'/'.join(map(str, runs))} interleaved run(s) per variant, bars min-max"
                if ok else f"{rounds or '?'} round(s)")
    return (f"leantrain bench: {len(ok)} variant(s)" + (f", {failed} failed (see bench.csv)" if failed else "")
            + f"\n{measured}")


def plot(rows: list[dict], path: Path, rounds: int | None = None) -> Path:
    """Peak memory (MB) against throughput (samples/s), one labelled point per variant that ran: the median over
    the rounds, with a horizontal bar from the slowest to the fastest round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for r, label in zip(ok, short_labels(ok)):
        x, y = r["samples_per_second"], r["peak_memory_bytes"] / 1e6
        lo, hi = r.get("samples_per_second_min", x), r.get("samples_per_second_max", x)
        ax.errorbar([x], [y], xerr=[[x - lo], [hi - x]], fmt="o", ms=6, capsize=4)
        label += " (within noise)" if r.get("speed_vs_baseline") == "within noise" else ""
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.margins(x=0.2, y=0.15)
    kind = {"rss": "peak RSS", "cuda_allocated": "peak CUDA allocated"}.get(ok[0]["memory_kind"], "peak") if ok else "peak"
    ax.set_xlabel("throughput (samples/s, higher is better)")
    ax.set_ylabel(f"{kind} memory (MB, lower is better)")
    ax.set_title(chart_title(rows, rounds), fontsize=10)
    ax.grid(alpha=0.3)
    if not ok:
        ax.text(0.5, 0.5, "no variant ran", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
