"""What a student learns in the same wall-clock budget (not a test): on-policy distillation from a teacher against GRPO
from a reward and against SFT on the teacher's samples, on a verifiable task.

    PYTHONPATH=src flock /tmp/leantrain-cpu.lock python -m benchmarks.convergence.distill_vs_grpo \
        --teacher /work/teachers/arith-sft/model --task /work/teachers/task --steps 60 --json out.json

Task: ``benchmarks.convergence.distill_task`` (two-digit additions "What is a + b?" with the arithmetic system turn,
an ``answer`` column, eval prompts disjoint from the training ones). Teacher: SmolLM2-135M-Instruct after SFT on that
task (``distill_task``'s recipe). Student: the base SmolLM2-135M-Instruct (the ``smollm2-135m`` preset). Every
contender trains the whole student, bf16 autocast over fp32 weights, AdamW, linear decay without warm-up, seed 0, the
training prompts in the same seeded order, each in a fresh process:

  distill   model.task=distill, on-policy (lmbda 1), reverse KL (beta 1), temperature 1, 16 new tokens, 8 prompts a
            step, lr --lr-distill, --steps steps: its training loop's seconds are the budget
  grpo      model.task=grpo, grpo.rewards=[numeric:answer], 8 completions of 16 tokens per prompt, 8 prompts a step, lr
            3e-5 (examples/grpo-arithmetic.yaml's), as many steps as fit the budget (from a 2-step probe's s/step)
  sft       the teacher's greedy answers to the prompts distill saw (sampled once, leantrain's engine: its seconds are
            taken from the budget), then SFT on them (loss on the answer), 8 rows a step, lr --lr-sft, as many steps as
            fit what is left of the budget
  base, teacher   not trained

One evaluator for every model: ``leantrain eval <model> model.task=distill distill.teacher=<teacher>
data.eval=<task>/eval.jsonl "grpo.rewards=[numeric:answer]"``: greedy completions of the held-out prompts, their reward
(the last number equals the answer) and the student's reverse KL to the teacher on them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

PY = [sys.executable, "-m", "leantrain"]
COMMON = ["model.name=smollm2-135m", "train.seed=0", "report.plots=false", "report.progress=plain",
          "train.log_every_steps=5", "train.eval_every_steps=0", "checkpoint.every_steps=0"]


def run(args: list[str], log: Path) -> float:
    """A leantrain command in a process of its own, its output in ``log``; its wall seconds."""
    start = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(PY + args, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{' '.join(args[:3])} ... failed ({done.returncode}): see {log}")
    return time.perf_counter() - start


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())["train"]


def evaluate(model: str, teacher: str, task: Path, work: Path, name: str) -> dict:
    report = work / f"{name}-eval.json"
    run(["eval", model, "model.task=distill", f"distill.teacher={teacher}", f"data.eval={task / 'eval.jsonl'}",
         "grpo.rewards=[numeric:answer]", "distill.max_new_tokens=16", "--output", str(report)],
        work / f"{name}-eval.log")
    ev = json.loads(report.read_text())["eval"]
    return {k: ev.get(k) for k in ("reward", "reverse_kl", "forward_kl", "student_logp", "teacher_logp", "samples")}


def seconds_per_step(args: list[str], out: Path, log: Path) -> float:
    """The loop's seconds per step of a 2-step probe of ``args``."""
    run(["train", *args, "train.max_steps=2", f"output_dir={out}"], log)
    tr = summary(out)
    return tr["loop_seconds"] / tr["steps"]


def teacher_samples(teacher: str, task: Path, rows: int, out: Path) -> float:
    """The teacher's greedy answers (16 new tokens, leantrain's engine, bf16 autocast) to the first ``rows`` training
    prompts, written as SFT rows (prompt + completion) to ``out``; the seconds it took."""
    from leantrain.config import resolve
    from leantrain.data.lm import prompts
    from leantrain.data.lm.preference_render import policy_rendering
    from leantrain.modeling.generation.decode import generate, pad_id, stop_ids
    from leantrain.modeling.generation.sampling import Sampling
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(teacher)
    model = AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.bfloat16).eval()
    lines = [json.loads(x) for x in (task / "train.jsonl").read_text().splitlines()[:rows]]
    rendering = policy_rendering(tok, "auto", textual=False)
    collate = prompts.collator(tok, resolve(None, []).data, train=True)
    written = []
    for at in range(0, len(lines), 64):
        part = lines[at:at + 64]
        batch = collate([{"prompt_input_ids": prompts.render_prompt(r["prompt"], tok, rendering), **r} for r in part])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            rollout = generate(model, batch["prompt_input_ids"], batch["prompt_attention_mask"], num_generations=1,
                               sampling=Sampling(16, 0.0, 1.0, 0), eos_ids=stop_ids(model, tok), pad_id=pad_id(tok))
        for r, ids, n in zip(part, rollout.completion_ids.tolist(), rollout.completion_mask.sum(-1).tolist()):
            text = tok.decode(ids[:n], skip_special_tokens=True)
            written.append({"messages": [*r["prompt"], {"role": "assistant", "content": text}]})
    out.write_text("".join(json.dumps(w) + "\n" for w in written))
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default="/work/teachers/arith-sft/model")
    ap.add_argument("--task", type=Path, default=Path("/work/teachers/task"))
    ap.add_argument("--steps", type=int, default=60, help="distillation's steps: its loop seconds are the budget")
    ap.add_argument("--lr-distill", type=float, default=3e-5)
    ap.add_argument("--lr-sft", type=float, default=3e-5)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/distill-vs-grpo"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work, task, teacher = args.workdir, args.task, args.teacher
    work.mkdir(parents=True, exist_ok=True)
    prompts_file = task / "train_prompts.jsonl"
    results: dict[str, dict] = {}

    distill = [*COMMON, "model.task=distill", f"distill.teacher={teacher}", f"data.train={prompts_file}",
               f"data.eval={task / 'eval.jsonl'}", "data.max_eval_samples=8", "distill.max_new_tokens=16",
               "train.batch_size=8", f"train.lr={args.lr_distill}"]
    wall = run(["train", *distill, f"train.max_steps={args.steps}", f"output_dir={work / 'distill'}"],
               work / "distill.log")
    budget = summary(work / "distill")["loop_seconds"]
    results["distill"] = {"steps": args.steps, "loop_seconds": budget, "wall_seconds": wall}
    print(f"distill: {args.steps} steps, loop {budget:.0f} s", flush=True)

    grpo = [*COMMON, "model.task=grpo", "grpo.rewards=[numeric:answer]", f"data.train={prompts_file}",
            f"data.eval={task / 'eval_prompts.jsonl'}", "data.max_eval_samples=8", "grpo.num_generations=8",
            "grpo.max_new_tokens=16", "train.batch_size=8", "train.lr=3e-5"]
    per_step = seconds_per_step(grpo, work / "grpo-probe", work / "grpo-probe.log")
    steps = max(1, round(budget / per_step))
    wall = run(["train", *grpo, f"train.max_steps={steps}", f"output_dir={work / 'grpo'}"], work / "grpo.log")
    results["grpo"] = {"steps": steps, "loop_seconds": summary(work / "grpo")["loop_seconds"], "wall_seconds": wall}
    print(f"grpo: {steps} steps ({per_step:.1f} s/step), loop {results['grpo']['loop_seconds']:.0f} s", flush=True)

    sampled = teacher_samples(teacher, task, args.steps * 8, work / "teacher-samples.jsonl")
    sft = [*COMMON, "model.task=causal-lm", f"data.train={work / 'teacher-samples.jsonl'}",
           f"data.eval={task / 'sft_eval.jsonl'}", "data.block_size=256", "data.packing=false", "train.batch_size=8",
           f"train.lr={args.lr_sft}"]
    per_step = seconds_per_step(sft, work / "sft-probe", work / "sft-probe.log")
    steps = max(1, round(max(0.0, budget - sampled) / per_step))
    wall = run(["train", *sft, f"train.max_steps={steps}", f"output_dir={work / 'sft'}"], work / "sft.log")
    results["sft"] = {"steps": steps, "loop_seconds": summary(work / "sft")["loop_seconds"], "wall_seconds": wall,
                      "teacher_sampling_seconds": sampled}
    print(f"sft: {sampled:.0f} s of teacher samples, {steps} steps ({per_step:.1f} s/step)", flush=True)

    for name, model in (("base", "smollm2-135m"), ("teacher", teacher), ("distill", str(work / "distill" / "model")),
                        ("grpo", str(work / "grpo" / "model")), ("sft", str(work / "sft" / "model"))):
        results.setdefault(name, {}).update(evaluate(model, teacher, task, work, name))
        print(f"{name}: {results[name]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
