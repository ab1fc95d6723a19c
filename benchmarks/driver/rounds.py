"""Contenders interleaved over rounds (A B C ... A B C ...), each run in a fresh process of the benchmark's own
module (``python -m MODULE --worker NAME ...``, so peak RSS is per run), the results saved and read back, and the
arguments and worker folders of the scripts built on them."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.driver.tables import machine, results_block, write_block


def interleaved(module: str, names: list[str], repeats: int, json_path: str | None = None
                ) -> tuple[dict[str, list[dict]], dict]:
    """Run ``python -m module --worker NAME <this command's arguments>`` for each name, interleaved (A B C ... A B C
    ...) over ``repeats`` rounds, each in a fresh process (its round, from 0, in ``$BENCH_ROUND``); a worker prints its
    result as one ``RESULT {json}`` line. Returns
    the results per name (a failed run is left out and its error printed) and the run's meta (command, machine,
    start, load average before and after); ``json_path``: both saved there."""
    meta = {"command": f"python -m {module} " + " ".join(sys.argv[1:]), "machine": machine(),
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": os.getloadavg()[0]}
    results: dict[str, list[dict]] = {n: [] for n in names}
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for r in range(repeats):
        for name in names:
            cmd = [sys.executable, "-m", module, "--worker", name] + [a for a in sys.argv[1:] if a != "--worker"]
            out = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, BENCH_ROUND=str(r)))
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"{name}: FAILED\n{out.stderr[-3000:]}", file=sys.stderr)
                continue
            results[name].append(json.loads(line[7:]))
            print(f"round {r + 1} {name}: {results[name][-1]}", file=sys.stderr, flush=True)
    meta["load_after"] = os.getloadavg()[0]
    if json_path:
        Path(json_path).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return results, meta


def rounds(module: str, args) -> tuple[dict[str, list[dict]], dict]:
    """``--from-json``: the results and meta a run saved with ``--json``; else new ``interleaved`` rounds of
    ``args.only`` (comma-separated) x ``args.repeats``."""
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        return saved["results"], saved["meta"]
    return interleaved(module, args.only.split(","), args.repeats, args.json)


def rounds_table(module: str, args, table, key: str) -> None:
    """``rounds``, printed as ``table(results)``; with ``--results``, also written into that file's ``key`` block."""
    results, meta = rounds(module, args)
    text = table(results)
    print(text)
    if args.results:
        write_block(Path(args.results), key, results_block(meta, text))


def driver_arguments(p: argparse.ArgumentParser, contenders: list[str], workdir: str, block: str,
                     eval_help: str) -> None:
    """The arguments of a script whose workers train then evaluate once (against.sft_vs_trl, against.dpo_vs_trl):
    --repeats, --only, --no-eval, --workdir, --json, --results (its ``block``), --from-json, --worker (hidden)."""
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds")
    p.add_argument("--only", default=",".join(contenders), help="comma-separated contenders")
    p.add_argument("--no-eval", dest="eval", action="store_false", help=eval_help)
    p.add_argument("--workdir", default=workdir)
    p.add_argument("--json", default=None)
    p.add_argument("--results", default=None, metavar="RESULTS.md", help=f"write the table into its {block} block")
    p.add_argument("--from-json", default=None, help="no run: render the results saved by --json")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def worker_folder(args) -> Path:
    """The worker's fresh folder (``--workdir``/NAME; a fresh run each round). Sets ``args.eval_now``: its held-out
    evaluation runs in the first round only (training is seeded, so the rounds train the same model); call
    :func:`evaluated` once it has run."""
    out = Path(args.workdir) / args.worker
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    args.eval_now = args.eval and not (Path(args.workdir) / f"{args.worker}.evaluated").exists()
    return out


def evaluated(args) -> None:
    """Mark the worker's held-out evaluation done (the next rounds skip it)."""
    (Path(args.workdir) / f"{args.worker}.evaluated").touch()


def fresh_rounds(module: str, args, table, key: str) -> None:
    """The driver of such a script: ``rounds_table`` in a fresh ``--workdir`` (no eval marks left from an earlier
    run; kept with --from-json, which runs nothing)."""
    if not args.from_json:
        shutil.rmtree(args.workdir, ignore_errors=True)
    rounds_table(module, args, table, key)
