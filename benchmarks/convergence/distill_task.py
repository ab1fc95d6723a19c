"""The task and the teacher of the on-policy distillation benchmark (not a test): two-digit additions with a checkable
answer, and SmolLM2-135M-Instruct (the ``smollm2-135m`` preset) fine-tuned on them by leantrain's SFT until its
greedy answers to held-out prompts are clearly better than the base model's.

    PYTHONPATH=src:. python -m benchmarks.convergence.distill_task OUT_DIR            # write the task's files
    PYTHONPATH=src:. flock /tmp/leantrain-cpu.lock \\
        python -m benchmarks.convergence.distill_task OUT_DIR --train [--teacher /work/teachers/arith-sft] \\
        [--epochs 2] [--lr 1e-4]                                                     # + train the teacher, eval both
    PYTHONPATH=src:. python -m benchmarks.convergence.distill_task OUT_DIR --eval MODEL [MODEL ...]   # eval only

The task (seeded, no files shipped): "What is a + b?" with a and b in ``LOW..HIGH`` (10..99), after the system turn
of leantrain's built-in arithmetic prompts (``leantrain.data.lm.arithmetic.SYSTEM``: "Answer with just the
number"). ``N_TRAIN`` train and ``N_EVAL`` eval questions drawn without replacement from the UNORDERED pairs
{a, b}: no question appears twice, and no eval question is a train question with its terms swapped. Files in OUT_DIR:

    train.jsonl, eval.jsonl      prompt (messages: system, user), answer (int), completion ([assistant message]):
                                 TRL's conversational prompt/completion rows (what a distillation method reads)
    train_prompts.jsonl,         prompt, answer: prompt-only rows, what model.task=grpo and ``leantrain eval ...
    eval_prompts.jsonl           "grpo.rewards=[numeric:answer]"`` read (leantrain's prompts data side refuses a file
                                 with a completion column)
    sft.jsonl, sft_eval.jsonl    messages (system, user, assistant): what leantrain's SFT reads (its prompt/completion
                                 format takes text prompts only, not message lists)

--train: ``leantrain train model.name=smollm2-135m model.task=causal-lm data.train=sft.jsonl
data.eval=sft_eval.jsonl`` (the chat template, loss on the assistant turn only: the answer and its ``<|im_end|>``),
--epochs epochs at --lr (AdamW, linear decay, 6% warm-up), global batch --batch-size, saved to --teacher (outside
the repository; its ``model/`` is the teacher). Then both models are evaluated the way GRPO runs are
(benchmarks/results/grpo.md): ``leantrain eval MODEL model.task=grpo data.eval=eval_prompts.jsonl
"grpo.rewards=[numeric:answer]" grpo.max_new_tokens=16`` (--new-tokens): greedy, the mean held-out reward
(1 when the completion's last number is the answer). Prints the commands, their wall times and the rewards;
``--json`` writes them. Measured with the defaults (2026-12-06, 2 CPU cores, 11 minutes of training): the base
model 0.005, the teacher 0.820 (benchmarks/results/distill.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from leantrain.data.lm.arithmetic import SYSTEM

SEED = 4321
LOW, HIGH = 10, 99  # both terms two-digit
N_TRAIN, N_EVAL = 2000, 200
MODEL = "smollm2-135m"
TEACHER = "/work/teachers/arith-sft"
REWARDS = "grpo.rewards=[numeric:answer]"
NEW_TOKENS = 16


def pairs(seed: int = SEED, n_train: int = N_TRAIN, n_eval: int = N_EVAL) -> tuple[list[tuple], list[tuple]]:
    """(train, eval) (a, b) pairs: distinct unordered pairs drawn without replacement, each shown in a random order;
    the eval pairs share no unordered pair with the train ones."""
    rng = random.Random(seed)
    unordered = list(itertools.combinations_with_replacement(range(LOW, HIGH + 1), 2))
    chosen = rng.sample(unordered, n_train + n_eval)
    ordered = [p if rng.random() < 0.5 else p[::-1] for p in chosen]
    return ordered[:n_train], ordered[n_train:]


def row(a: int, b: int) -> dict:
    """One question: the prompt messages, the answer and the completion (the answer as the assistant's turn)."""
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} + {b}?"}],
            "answer": a + b, "completion": [{"role": "assistant", "content": str(a + b)}]}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write(out_dir: str | os.PathLike) -> dict[str, Path]:
    """Every file of the task into ``out_dir`` (overwriting); name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = ([row(a, b) for a, b in split] for split in pairs())
    files = {}
    for name, rows in (("train", train), ("eval", held_out)):
        files[name] = write_jsonl(out / f"{name}.jsonl", rows)
        files[f"{name}_prompts"] = write_jsonl(out / f"{name}_prompts.jsonl",
                                               [{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
        files["sft" if name == "train" else "sft_eval"] = write_jsonl(
            out / ("sft.jsonl" if name == "train" else "sft_eval.jsonl"),
            [{"messages": r["prompt"] + r["completion"]} for r in rows])
    return files


# ------------------------------------------------------------------------------------------------ runs


def leantrain(*arguments: str) -> tuple[list[str], float]:
    """``python -m leantrain ARGUMENTS`` in a fresh process (its output passed through): (the command, seconds)."""
    command = [sys.executable, "-m", "leantrain", *arguments]
    print("$ " + " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    return command, time.perf_counter() - start


def train_overrides(files: dict[str, Path], teacher: str, args) -> list[str]:
    return [f"model.name={MODEL}", "model.task=causal-lm", f"data.train={files['sft']}",
            f"data.eval={files['sft_eval']}", "data.block_size=256", f"train.epochs={args.epochs}",
            f"train.lr={args.lr}", f"train.batch_size={args.batch_size}", f"train.seed={args.seed}",
            "report.plots=false", "report.progress=plain", "checkpoint.every_steps=0", f"output_dir={teacher}",
            *args.set]


def train_teacher(files: dict[str, Path], teacher: str, args) -> dict:
    """SFT of the base model on sft.jsonl into ``teacher``: the command, its wall time and summary.json's eval."""
    command, seconds = leantrain("train", *train_overrides(files, teacher, args))
    summary = json.loads((Path(teacher) / "summary.json").read_text())
    return {"command": command, "seconds": seconds, "steps": summary["train"]["steps"],
            "train_loop_seconds": summary["train"]["loop_seconds"], "sft_eval": summary.get("eval")}


def held_out(model: str, files: dict[str, Path], out: Path, new_tokens: int = NEW_TOKENS) -> dict:
    """The mean greedy reward of ``model`` on eval_prompts.jsonl (``leantrain eval``, at most ``new_tokens`` new
    tokens), the command and its time."""
    name = Path(model).parent.name if Path(model).name == "model" else Path(model).name
    report = out / f"eval-{name}-{new_tokens}.json"
    command, seconds = leantrain("eval", model, "model.task=grpo", f"data.eval={files['eval_prompts']}", REWARDS,
                                 f"grpo.max_new_tokens={new_tokens}", "--output", str(report))
    return {"model": model, "new_tokens": new_tokens, "reward": json.loads(report.read_text())["eval"]["reward"],
            "command": command, "seconds": seconds, "report": str(report)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", help="where the task's files go (and the eval reports)")
    p.add_argument("--train", action="store_true", help="train the teacher, then evaluate the base and the teacher")
    p.add_argument("--eval", nargs="+", metavar="MODEL", default=[], help="evaluate these models only")
    p.add_argument("--no-base", action="store_true", help="with --train: skip the base model's evaluation")
    p.add_argument("--teacher", default=TEACHER, help="the teacher's run folder (its model/ is the teacher)")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=32, help="examples per optimizer step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another leantrain train override")
    p.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="new tokens at most per eval completion "
                   "(16: as benchmarks/against/grpo_vs_trl.py; the base model reasons in words and is cut there)")
    p.add_argument("--json", help="write the commands, times and rewards here")
    args = p.parse_args()
    files = write(args.out_dir)
    for path in files.values():
        print(path)
    result: dict = {"task": {"seed": SEED, "terms": [LOW, HIGH], "train": N_TRAIN, "eval": N_EVAL}}
    if args.train:
        result["teacher"] = train_teacher(files, args.teacher, args)
        models = ([] if args.no_base else [MODEL]) + [str(Path(args.teacher) / "model")]
    else:
        models = args.eval
    result["held_out"] = [held_out(m, files, Path(args.out_dir), args.new_tokens) for m in models]
    for r in result["held_out"]:
        print(f"held-out reward {r['reward']:.3f}  {r['model']}  ({r['seconds']:.0f} s)")
    if "teacher" in result:
        print(f"teacher trained in {result['teacher']['seconds']:.0f} s ({result['teacher']['steps']} steps)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
