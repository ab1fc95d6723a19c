"""The bench's outputs: a terminal table, bench.csv, bench.json and bench.png (peak memory vs throughput)."""

from __future__ import annotations

import csv
from pathlib import Path

from leantrain.report.logs import write_json

RATIO_KEYS = ["samples_per_second", "tokens_per_second", "peak_memory_bytes", "optim_state_bytes", "eval_loss",
              "eval_accuracy"]
CSV_COLUMNS = ["variant", "status", "runs", "failed_runs", "samples_per_second", "tokens_per_second",
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


def write_all(result: dict, out: Path) -> None:
    rows = result["rows"]
    write_json(out / "bench.json", result)
    with (out / "bench.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    plot(rows, out / "bench.png")


def _num(value, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value / scale)


def _with_ratio(row: dict, key: str, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    ratio = row.get(f"{key}_ratio")
    return _num(row.get(key), scale, fmt) + ("" if ratio is None else f" ({ratio:.2f}x)")


def format_table(rows: list[dict]) -> str:
    """Plain aligned text, one line per variant; ratios to the baseline in brackets; errors below the table."""
    head = ["variant", "status", "samples/s", "tokens/s", "peak mem MB", "optim state MB", "B/param", "eval loss",
            "eval acc"]
    body = []
    for r in rows:
        body.append([r["variant"], r["status"], _with_ratio(r, "samples_per_second"),
                     _with_ratio(r, "tokens_per_second", fmt="{:.0f}"), _with_ratio(r, "peak_memory_bytes", 1e6, "{:.0f}"),
                     _with_ratio(r, "optim_state_bytes", 1e6), _num(r.get("optim_state_bytes_per_param"), fmt="{:.2f}"),
                     _with_ratio(r, "eval_loss", fmt="{:.4f}"), _with_ratio(r, "eval_accuracy", fmt="{:.4f}")])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    text = [line(head), line(["-" * w for w in widths]), *map(line, body)]
    base = rows[0].get("baseline") if rows else None
    if base:
        text.append(f"ratios (x) are to the baseline: {base}")
    text += [f"error in {r['variant']}: {r['error']}" for r in rows if r.get("error")]
    return "\n".join(text)


def short_labels(rows: list[dict]) -> list[str]:
    """Each variant's overrides without those every variant shares (``train.lr=1e-3`` in a 2x1 sweep)."""
    common = set.intersection(*(set(r.get("overrides") or []) for r in rows)) if len(rows) > 1 else set()
    return [" ".join(o for o in r.get("overrides") or [] if o not in common) or r["variant"] for r in rows]


def plot(rows: list[dict], path: Path) -> Path:
    """Peak memory (MB) against throughput (samples/s), one labelled point per variant that ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for r, label in zip(ok, short_labels(ok)):
        x, y = r["samples_per_second"], r["peak_memory_bytes"] / 1e6
        ax.scatter([x], [y], s=40)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.margins(x=0.2, y=0.15)
    kind = {"rss": "peak RSS", "cuda_allocated": "peak CUDA allocated"}.get(ok[0]["memory_kind"], "peak") if ok else "peak"
    ax.set_xlabel("throughput (samples/s, higher is better)")
    ax.set_ylabel(f"{kind} memory (MB, lower is better)")
    failed = len(rows) - len(ok)
    ax.set_title(f"leantrain bench: {len(ok)} variant(s)" + (f", {failed} failed (see bench.csv)" if failed else ""))
    ax.grid(alpha=0.3)
    if not ok:
        ax.text(0.5, 0.5, "no variant ran", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
