"""What a turn of a multi-turn episode costs, and what keeping each episode's KV cache between turns saves against
encoding the whole episode again at every turn (``grpo.episode_cache=keep|prefill``, issue 51).

SmolLM2-135M-Instruct trained with GRPO on the built-in calculator problems (examples/grpo-calculator.yaml's setting:
the calculator tool, one worked episode in the prompt, 8 prompts x 8 episodes a step, 48 new tokens a turn; 2 prompts
(16 episodes) trained at a time) with
``recheck_env.Recheck``: every episode runs exactly --turns turns (the environment answers each turn: the tool's
result, or "check it once more"), up to 96 tokens of episode per turn. Each (turns, cache) pair is one ``leantrain
train`` process of --steps steps, the pairs interleaved over --rounds; the first step is left out of the means (the
first generation builds the engine).

    flock /tmp/leantrain-cpu.lock python -m benchmarks.speed.episode_turns OUT_DIR [--turns 1 2 4] [--steps 3]
        [--rounds 1] [--precision bf16] [--caches keep prefill] [--set KEY=VALUE ...]

Measured per pair: tokens/s (the run's own: prompt + episode tokens over the step's wall), seconds a step, the
generation's share of the step (``time_share``), the environment's, turns and length of an episode, the peak RSS
(``summary.json``). Writes OUT_DIR/results.json and prints a markdown table. Not a test.

With --eval-model MODEL (a model trained on the calculator, e.g. by benchmarks/convergence/grpo_calculator.sh): the
generation alone, ``leantrain eval`` of it (one greedy episode per built-in eval prompt, 64 a batch) per (turns,
cache): wall seconds and peak RSS, into OUT_DIR/eval-results.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ENV = str(Path(__file__).with_name("recheck_env.py")) + ":Recheck"
COMMON = ["model.name=smollm2-135m", "model.task=grpo", "data.train=builtin:calculator", "grpo.num_generations=8",
          "grpo.temperature=1.0", "train.batch_size=8", "train.lr=3e-5", "report.plots=false",
          "report.progress=plain", "checkpoint.every_steps=0", "data.max_eval_samples=8", "grpo.max_new_tokens=48",
          "train.micro_batch_size=2",
          "grpo.rewards=[]", "train.log_every_steps=1", f"grpo.environment={ENV}"]


def run(out: Path, turns: int, cache: str, steps: int, precision: str, round_: int, extra: list[str]) -> dict:
    folder = out / f"r{round_}-turns{turns}-{cache}"
    args = [*COMMON, f"grpo.max_turns={turns}", f"grpo.max_episode_tokens={96 * turns}",
            f"grpo.episode_cache={cache}", f"train.max_steps={steps}", f"efficiency.precision={precision}",
            f"output_dir={folder}", *extra]
    with open(folder.with_suffix(".log"), "w") as log:
        subprocess.run([sys.executable, "-m", "leantrain", "train", *args], check=True, stdout=log,
                       stderr=subprocess.STDOUT)
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("type") == "train"][1:] or [r for r in rows if r.get("type") == "train"]
    summary = json.loads((folder / "summary.json").read_text())
    mean = lambda f: statistics.mean(f(r) for r in rows)  # noqa: E731
    return {"turns": turns, "cache": cache, "steps": [r["step"] for r in rows],
            "tokens_per_second": mean(lambda r: r["tokens_per_second"]),
            "seconds_per_step": mean(lambda r: sum(r["time_split"].values())),
            "generation_share": mean(lambda r: r["time_share"]["generation"]),
            "generation_seconds": mean(lambda r: r["time_split"]["generation"]),
            "environment_share": mean(lambda r: r["time_share"].get("environment", 0.0)),
            "episode_turns": mean(lambda r: r["episodes/turns"]), "episode_length": mean(lambda r: r["episodes/length"]),
            "reward": mean(lambda r: r["reward"]), "peak_rss_gib": summary["train"]["peak_memory_bytes"] / 2**30}


def evaluated(out: Path, model: str, turns: int, cache: str, precision: str, round_: int) -> dict:
    """Generation alone: ``leantrain eval`` of ``model`` on the built-in calculator eval prompts, one greedy episode
    each, 64 episodes a batch; its wall and peak RSS (``/usr/bin/time``), model load included (the same in both)."""
    name = out / f"r{round_}-eval-turns{turns}-{cache}"
    problems = out / "problems"
    if not (problems / "eval.jsonl").exists():
        subprocess.run([sys.executable, "-m", "leantrain.data.lm.calculator_problems", str(problems)], check=True)
    args = [model, "model.task=grpo", f"grpo.environment={ENV}", "grpo.rewards=[]", "grpo.max_new_tokens=48",
            f"grpo.max_turns={turns}", f"grpo.max_episode_tokens={96 * turns}", f"grpo.episode_cache={cache}",
            f"data.eval={problems / 'eval.jsonl'}", f"efficiency.precision={precision}", "--batch-size", "64",
            "--output", str(name.with_suffix(".json"))]
    start = time.perf_counter()
    with open(name.with_suffix(".log"), "w") as log:
        subprocess.run(["/usr/bin/time", "-f", "peak_kib=%M", sys.executable, "-m", "leantrain", "eval", *args],
                       check=True, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    ev = json.loads(name.with_suffix(".json").read_text())["eval"]
    peak = int(name.with_suffix(".log").read_text().rsplit("peak_kib=", 1)[1].split()[0])
    return {"turns": turns, "cache": cache, "wall_seconds": wall, "reward": ev["reward"],
            "episode_turns": ev["episodes/turns"], "episode_length": ev["episodes/length"],
            "peak_rss_gib": peak / 2**20, "samples": ev["samples"]}


def eval_table(results: list[dict]) -> str:
    lines = ["| turns | cache | eval wall s | reward | turns / episode | episode tokens | peak RSS GiB |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['turns']} | {r['cache']} | {r['wall_seconds']:.1f} | {r['reward']:.2f} | "
                     f"{r['episode_turns']:.2f} | {r['episode_length']:.0f} | {r['peak_rss_gib']:.2f} |")
    return "\n".join(lines)


def table(results: list[dict]) -> str:
    lines = ["| turns | cache | tokens/s | s / step | generation s (share) | environment share | turns / episode "
             "| episode tokens | peak RSS GiB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['turns']} | {r['cache']} | {r['tokens_per_second']:.0f} | {r['seconds_per_step']:.1f} | "
                     f"{r['generation_seconds']:.1f} ({r['generation_share']:.0%}) | {r['environment_share']:.1%} | "
                     f"{r['episode_turns']:.2f} | {r['episode_length']:.0f} | {r['peak_rss_gib']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--turns", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--caches", nargs="+", default=["keep", "prefill"], choices=["keep", "prefill"])
    p.add_argument("--set", nargs="*", default=[], help="more key=value overrides for every training run")
    p.add_argument("--eval-model", help="time `leantrain eval` of this trained model instead (generation alone)")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    if a.eval_model:
        for r in range(a.rounds):
            for turns in a.turns:
                for cache in a.caches if r % 2 == 0 else a.caches[::-1]:
                    results.append(dict(evaluated(a.out, a.eval_model, turns, cache, a.precision, r + 1), round=r + 1))
                    print(json.dumps(results[-1]), flush=True)
                    (a.out / "eval-results.json").write_text(json.dumps(results, indent=1))
        print(eval_table(results))
        return
    for r in range(a.rounds):
        for turns in a.turns:
            order = a.caches if r % 2 == 0 else a.caches[::-1]
            for cache in order if turns > 1 else order[:1]:
                results.append(dict(run(a.out, turns, cache, a.steps, a.precision, r + 1, a.set), round=r + 1))
                print(json.dumps(results[-1]), flush=True)
                (a.out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
