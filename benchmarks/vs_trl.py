"""What the benchmarks against TRL share (sft_vs_trainer, dpo_vs_trl, rm_vs_trl): the command line and driver around
``vs_trainer.rounds_table``, the clock of a TRL trainer's loop, and the medians and ratios their tables print."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def bench_main(script: str, p: argparse.ArgumentParser, contenders: list[str], workdir: str, key: str, worker,
               table) -> None:
    """Add the arguments every such benchmark takes to ``p`` (its own ones already added), then run ``worker(args)``
    in a worker process, else the interleaved rounds (a fresh ``--workdir``), printed as ``table`` and written into
    the ``key`` block of ``--results``."""
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds")
    p.add_argument("--only", default=",".join(contenders), help="comma-separated contenders")
    p.add_argument("--no-eval", dest="eval", action="store_false", help="no held-out evaluation")
    p.add_argument("--workdir", default=workdir)
    p.add_argument("--json", default=None)
    p.add_argument("--results", default=None, metavar="RESULTS.md", help=f"write the table into its {key} block")
    p.add_argument("--from-json", default=None, help="no run: render the results saved by --json")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, str(Path(script).resolve().parent))
    if args.worker:
        return worker(args)
    from vs_trainer import rounds_table

    if not args.from_json:
        shutil.rmtree(args.workdir, ignore_errors=True)  # no eval marks left from an earlier run
    rounds_table(script, args, table, key)


def loop_clock(stamps: list[float]):
    """A TrainerCallback appending the time at the start and at the end of training (CUDA synchronised)."""
    import torch
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            stamps.append(time.perf_counter())

        def on_train_end(self, *a, **k):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    return Clock()


def median(results: dict[str, list[dict]], name: str, key: str):
    """The median of ``key`` over ``name``'s rounds that have it, else None."""
    vals = [r[key] for r in results.get(name, []) if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def ratio(results: dict[str, list[dict]], name: str, key: str, base: str) -> str:
    """``name``'s median of ``key`` over ``base``'s, as "1.23x" ("" where either is missing)."""
    a, b = median(results, name, key), median(results, base, key)
    return f"{a / b:.2f}x" if a and b else ""


def worker_dir(args) -> Path:
    """The worker's own folder under --workdir, emptied (a fresh run each round); sets ``args.eval_now``: evaluate
    in the first round only (training is seeded), marked by ``evaluated``."""
    out = Path(args.workdir) / args.worker
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    args.eval_now = args.eval and not (Path(args.workdir) / f"{args.worker}.evaluated").exists()
    return out


def evaluated(args) -> None:
    (Path(args.workdir) / f"{args.worker}.evaluated").touch()


def leantrain_eval(model: str, overrides: list[str], out: Path) -> dict:
    """``leantrain eval MODEL OVERRIDES --output out/eval.json`` in a fresh process: its ``eval`` metrics."""
    cmd = [sys.executable, "-m", "leantrain.cli", "eval", model, *overrides, "--output", str(out / "eval.json")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"leantrain eval failed:\n{r.stderr[-4000:]}")
    return json.loads((out / "eval.json").read_text())["eval"]
