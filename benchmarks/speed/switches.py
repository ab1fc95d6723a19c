"""Each efficiency switch on the packaged MiniLM with an SST-2 slice, side by side, as ratios to the plain
fp32 / padded baseline measured in the same run. Every variant runs in a fresh subprocess (peak RSS is a
process-lifetime number), variants interleaved over rounds so that machine noise spreads evenly.

    PYTHONPATH=src python -m benchmarks.speed.switches [--rounds 1] [--steps 10] [--rows 2000] [--compile]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.driver.jobs import DATA

import pandas as pd

SHARED = DATA / "sst2"
VARIANTS = {
    "fp32 padded (baseline)": ["data.batching=padded"],
    "grouped": ["data.batching=grouped"],
    "dynamic": ["data.batching=dynamic"],
    "bf16 padded": ["data.batching=padded", "efficiency.precision=bf16"],
    "bf16 grouped": ["data.batching=grouped", "efficiency.precision=bf16"],
    "checkpointing padded": ["data.batching=padded", "efficiency.gradient_checkpointing=true"],
    "micro 8 x accum 4 padded": ["data.batching=padded", "train.micro_batch_size=8"],
}
COMPILE = {"compile padded": ["data.batching=padded", "efficiency.compile=true"]}
CHILD = "import json, sys, leantrain; s = leantrain.train(None, sys.argv[1:]); print('SUMMARY' + json.dumps(s))"


def run_variant(overrides: list[str], common: list[str], out: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, *common, *overrides, f"output_dir={out}"],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode:
        raise SystemExit(f"variant {overrides} failed:\n{r.stderr[-2000:]}")
    s = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("SUMMARY"))[7:])
    t = s["train"]
    return {"samples/s": t["samples_per_second"], "tokens/s": t["tokens_per_second"],
            "peak RSS GB": t["peak_memory_bytes"] / 1e9, "MFU": t["mfu"] or 0.0,
            "compile s": s["efficiency"].get("compile_seconds") or 0.0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--compile", action="store_true", help="add torch.compile (slow: a cold compile per round)")
    args = ap.parse_args()
    variants = {**VARIANTS, **(COMPILE if args.compile else {})}
    tmp = Path(tempfile.mkdtemp(prefix="lt-bench-"))
    pd.read_csv(SHARED / "train.tsv", sep="\t", quoting=3).sample(n=args.rows, random_state=0).to_csv(
        tmp / "train.tsv", sep="\t", index=False)
    common = [f"data.train={tmp / 'train.tsv'}", f"data.eval={SHARED / 'dev.tsv'}", "data.max_eval_samples=64",
              f"train.max_steps={args.steps}", f"train.batch_size={args.batch}", "report.plots=false",
              "report.progress=none", "efficiency.precision=fp32"]
    results: dict[str, list[dict]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for i, (name, over) in enumerate(variants.items()):
            results[name].append(run_variant(over, common, tmp / f"r{r}-{i}"))
            print(f"round {r + 1}/{args.rounds}: {name} done", file=sys.stderr)
    med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in results.items()}
    base = med["fp32 padded (baseline)"]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared, noisy); "
          f"MiniLM-L6, SST-2 {args.rows} rows, batch {args.batch}, {args.steps} steps "
          f"(3 warm-up steps excluded), median of {args.rounds} interleaved round(s)\n")
    print("| variant | samples/s | tokens/s | peak RSS | MFU | ratio samples/s | ratio peak RSS | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    for k, m in med.items():
        print(f"| {k} | {m['samples/s']:.1f} | {m['tokens/s']:.0f} | {m['peak RSS GB']:.2f} GB | {m['MFU']:.3f} | "
              f"{m['samples/s'] / base['samples/s']:.2f}x | {m['peak RSS GB'] / base['peak RSS GB']:.2f}x | "
              f"{m['compile s']:.0f} |")


if __name__ == "__main__":
    main()
