"""What the benchmarks against TRL share (against.sft_vs_trl, dpo_vs_trl, rm_vs_trl, grpo_vs_trl) beyond ``rounds``
(``driver_arguments``, ``fresh_rounds``, ``worker_folder``, ``evaluated``, ``median``, ``ratio``): the clock of a
TRL trainer's loop, a ``leantrain`` command (train or eval) in a fresh process with what the tables read of it, the
round of one contender in its worker process (``run_worker``) and the ``main`` of such a script built from those
driver pieces (``script_parser``, ``bench_main``)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.driver.rounds import driver_arguments, evaluated, fresh_rounds, worker_folder


def script_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark script's parser: its docstring's first line as the description, the whole docstring after the
    options (``--help`` shows every setting the script fixes)."""
    return argparse.ArgumentParser(description=doc.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=doc)


def run_worker(args, train, speed, held_out, base: str | None = None) -> None:
    """One contender's round in its worker process (``--worker NAME``), printed as the RESULT line the driver reads:
    ``train(out)`` (a dict with ``loop_seconds``) and what ``speed(result)`` derives from it (tokens/s, ...), unless
    NAME is ``base``: the untrained model ``base``, evaluated only. ``held_out(model, out)`` (a dict: the held-out
    metrics of the model folder or name) runs in the first round only (``worker_folder`` / ``evaluated``)."""
    out = worker_folder(args)  # sets args.eval_now: the first round only
    result = {}
    if args.worker != "base":
        result = train(out)
        result.update(speed(result))
    if args.eval_now:
        result.update(held_out(base if args.worker == "base" else str(out / "model"), out))
        evaluated(args)
    print("RESULT " + json.dumps(result))


def bench_main(module: str, p: argparse.ArgumentParser, contenders: list[str], workdir: str, block: str,
               eval_help: str, worker, table) -> None:
    """``p`` (the script's own arguments added) plus ``rounds.driver_arguments``; then ``worker(args)`` in a
    worker process, else ``rounds.fresh_rounds`` printed as ``table`` (and into ``block`` of --results)."""
    driver_arguments(p, contenders, workdir, block, eval_help)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    fresh_rounds(module, args, table, block)


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


def leantrain(command: str, *arguments: str) -> None:
    """``python -m leantrain.cli COMMAND ARGUMENTS`` in a fresh process; exits with its stderr's tail on failure."""
    r = subprocess.run([sys.executable, "-m", "leantrain.cli", command, *arguments], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if r.returncode != 0:
        raise SystemExit(f"leantrain {command} failed:\n{r.stderr[-4000:]}")


def leantrain_eval(model: str, overrides: list[str], out: Path) -> dict:
    """``leantrain eval MODEL OVERRIDES --output out/eval.json`` in a fresh process: its ``eval`` metrics."""
    leantrain("eval", model, *overrides, "--output", str(out / "eval.json"))
    return json.loads((out / "eval.json").read_text())["eval"]


def leantrain_train(args, out: Path, *overrides: str) -> tuple[dict, dict]:
    """``leantrain train OVERRIDES output_dir=out/run`` in a fresh process; its model copied to ``out/model`` when
    ``args.eval_now`` (``rounds.worker_folder``). Returns its summary.json and what every table reads of it:
    loop and wall seconds, peak memory (CUDA max allocated on a GPU, else the peak RSS) and steps."""
    leantrain("train", *overrides, f"output_dir={out / 'run'}")
    summary = json.loads((out / "run" / "summary.json").read_text())
    tr = summary["train"]
    if args.eval_now:
        shutil.copytree(out / "run" / "model", out / "model", dirs_exist_ok=True)
    return summary, {"loop_seconds": tr["loop_seconds"], "wall_seconds": tr["wall_seconds"],
                     "peak_memory_bytes": tr.get("cuda_max_allocated_bytes") or tr["peak_memory_bytes"],
                     "steps": tr["steps"]}
