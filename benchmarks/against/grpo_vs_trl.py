"""GRPO, what it costs: SmolLM2-135M-Instruct on verifiable arithmetic prompts, leantrain against TRL's GRPOTrainer,
as a full fine-tune and with LoRA, the same reward function file loaded by both.

    python -m benchmarks.against.grpo_vs_trl                                           # 4 x 8 x 16, 8 steps, 2 rounds
    python -m benchmarks.against.grpo_vs_trl --prompts 2 --generations 4 --new-tokens 8 --steps 2 --repeats 1  # smoke
    python -m benchmarks.against.grpo_vs_trl --json out.json --results benchmarks/results/grpo.md
    python -m benchmarks.against.grpo_vs_trl --prompt-set word-problems --new-tokens 256 --steps 2 --only trl_full,full \
        --no-eval                                                   # long completions: GSM8K-style problems, 256 tokens

Needs TRL beside leantrain's environment: `pip install -e '.[bench]' -c constraints.txt` (TRL 1.16 installs beside
torch 2.13; it is not a leantrain dependency).

Job: the pretrained SmolLM2-135M-Instruct (the `smollm2-135m` preset; TRL loads the same folder,
`resolve_model_name`), GRPO on --steps x --prompts prompts of leantrain's built-in arithmetic task (a system turn
asking for just the number, a user turn "What is a + b?", an `answer` column; rendered with the chat template and a
generation prompt by both), one epoch,
--prompts prompts an optimizer step, each in ONE micro-batch (TRL: per_device_train_batch_size = prompts x
generations, no accumulation, so one generation per step), --generations completions per prompt, at most
--new-tokens new tokens, temperature 1.0, top_p 1, top_k off, loss dapo, beta 0 (no reference model), one update per
rollout, AdamW, the lr of --lr-full / --lr-lora, linear decay without warm-up, weight decay 0, clipping 1.0, bf16
autocast over fp32 weights where the CPU runs bf16 natively (`measure.default_precision`), seed 0. The reward:
benchmarks/against/grpo_reward.py:correct (1 when the completion's last number is the answer), the same file for both.
The same prompts in the same steps: leantrain orders its epoch by its seed (data.batching=dynamic: a plain seeded
permutation), TRL gets the rows in that order with shuffle_dataset=False. LoRA r=16, alpha 32, dropout 0.05 on
q/k/v/o/gate/up/down_proj. Every contender runs in a fresh process, interleaved over --repeats rounds; medians.

Contenders:
  trl_full   GRPOTrainer, the whole model trained, its defaults otherwise (gradient checkpointing on; generation
             with transformers' generate and the KV cache, checkpointing switched off for it)
  full       leantrain model.task=grpo, the whole model trained, its defaults otherwise
  trl_lora   GRPOTrainer + peft
  lora       leantrain peft.method=lora
  base       no training: the held-out reward of the base model (the bar both must clear)
  full_ckpt, lora_ckpt   (not run by default: --only) leantrain with efficiency.gradient_checkpointing=true, TRL's
             default: what the memory gap is made of
  full_every, lora_every (not run by default: --only) leantrain with grpo.skip_zero_advantage=off: every group
             trained, its flat groups (every advantage 0, no gradient) too, as TRL does: what skipping them saves

Measured, the same way for every contender: tokens/s = the prompt + completion tokens of the rollouts (prompt
tokens without padding, completion tokens up to and including the first EOS) over the seconds of the training loop,
generation included: TRL's `state.num_input_tokens_seen` (what it logs as `num_tokens`) over its `train()` loop
(`driver.trl.loop_clock`); leantrain's `train.tokens_seen` over `train.loop_seconds` of summary.json (every step:
its `tokens_per_second` leaves out `train.warmup_steps_excluded` warm-up steps, TRL's does not); peak memory = CUDA
max allocated on a GPU, else the process's peak RSS (VmHWM) at the end of training; where the time goes: TRL's
seconds inside `_generate` (generation) and the rest of `_generate_and_score_completions` (rewards, advantages),
the rest of the loop being training; leantrain's `train.time_split_seconds`; the mean training reward over the
steps; the held-out greedy reward = `leantrain eval <model> data.eval=<--eval-rows held-out prompts>
"grpo.rewards=[...]"` of each trained (merged) model and of the base model, first round only (training is seeded).
Not a test.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

from benchmarks.driver.jobs import REPO
from benchmarks.driver.measure import default_precision, peak_bytes
from benchmarks.driver.tables import median, ratio as ratio_of
from benchmarks.driver.trl import bench_main, leantrain_eval, leantrain_train, loop_clock, run_worker, script_parser

START = time.perf_counter()
CONTENDERS = ["trl_full", "full", "trl_lora", "lora", "base"]  # full_ckpt, lora_ckpt, full_every, lora_every: --only
MODEL, SEED = "smollm2-135m", 0
REWARD = "benchmarks/against/grpo_reward.py:correct"
LORA = {"r": 16, "alpha": 32, "dropout": 0.05,
        "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def data_files(args) -> tuple[Path, Path]:
    """The first --steps x --prompts prompts of --prompt-set (leantrain's built-in arithmetic task,
    ``data.lm.arithmetic``: a few tokens answer them; or its GSM8K-style word problems, ``data.lm.word_problems``,
    asked to reason step by step: completions run to --new-tokens) and the first --eval-rows of its held-out ones, as
    JSONL."""
    from leantrain.data.lm import arithmetic, word_problems

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    train, held_out = (word_problems if args.prompt_set == "word-problems" else arithmetic).build()
    paths = work / f"train_{args.steps * args.prompts}.jsonl", work / f"eval_{args.eval_rows}.jsonl"
    for path, rows in zip(paths, (train[:args.steps * args.prompts], held_out[:args.eval_rows])):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def leantrain_order(n: int) -> list[int]:
    """The order in which leantrain's one epoch visits ``n`` rows under data.batching=dynamic (a plain seeded
    permutation, ``data.batching.epoch_batches``), so TRL can be given the same prompts in the same steps."""
    from leantrain.data.batching import epoch_batches

    return [int(i) for b in epoch_batches([1] * n, 1, seed=SEED, epoch=0, batching="dynamic") for i in b]


# ------------------------------------------------------------------------------------------------ contenders


class TimedTrainer:
    """Seconds a GRPOTrainer spends generating (``_generate``) and making its rollouts (``_generate_and_score_
    completions``: generation, rewards, advantages); wraps the two methods of one trainer object."""

    def __init__(self, trainer):
        self.seconds = {"generate": 0.0, "rollout": 0.0}
        trainer._generate = self.timed("generate", trainer._generate)
        trainer._generate_and_score_completions = self.timed("rollout", trainer._generate_and_score_completions)

    def timed(self, key: str, fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[key] += time.perf_counter() - t0
        return wrapper


def log_records(records: list[dict]):
    """A TrainerCallback keeping every record the trainer logs (reward, num_tokens, ...)."""
    from transformers import TrainerCallback

    class Keep(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **k):
            records.append(dict(logs or {}))

    return Keep()


def run_trl(args, full: bool, out: Path) -> dict:
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.against.grpo_reward import correct
    from leantrain.modeling.names import resolve_model_name

    train, _ = data_files(args)
    rows = [json.loads(line) for line in open(train)]
    rows = [rows[i] for i in leantrain_order(len(rows))]
    path = resolve_model_name(MODEL)
    tok = AutoTokenizer.from_pretrained(path)
    stamps: list[float] = []
    records: list[dict] = []
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=args.prompts * args.generations,
        gradient_accumulation_steps=1, num_generations=args.generations, max_completion_length=args.new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, loss_type="dapo", beta=0.0, num_iterations=1, max_steps=args.steps,
        learning_rate=args.lr_full if full else args.lr_lora, lr_scheduler_type="linear", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, shuffle_dataset=False, bf16=default_precision() == "bf16", seed=SEED,
        logging_steps=1, save_strategy="no", report_to=[], dataloader_num_workers=0, disable_tqdm=True,
        use_cpu=not torch.cuda.is_available())
    lora = None if full else LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                                        target_modules=LORA["targets"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=[correct], args=config,
                          train_dataset=datasets.Dataset.from_list(rows), processing_class=tok, peft_config=lora,
                          callbacks=[loop_clock(stamps), log_records(records)])
    timer = TimedTrainer(trainer)
    trainer.train()
    loop = stamps[-1] - stamps[0]
    gen, rollout = timer.seconds["generate"], timer.seconds["rollout"]
    rewards = [r["reward"] for r in records if "reward" in r]
    result = {"loop_seconds": loop, "wall_seconds": time.perf_counter() - START, "peak_memory_bytes": peak_bytes(),
              "steps": trainer.state.global_step, "tokens": trainer.state.num_input_tokens_seen,
              "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
              "generation_seconds": gen, "scoring_seconds": rollout - gen, "training_seconds": loop - rollout,
              "train_reward": sum(rewards) / len(rewards) if rewards else None}
    if args.eval_now:
        merged = trainer.model if full else trainer.model.merge_and_unload()
        merged.save_pretrained(out / "model")
        tok.save_pretrained(out / "model")
    return result


def grpo_overrides(args) -> list[str]:
    """The GRPO settings leantrain's train and eval share."""
    return ["model.task=grpo", f"grpo.rewards=[{REPO / REWARD}]", f"grpo.max_new_tokens={args.new_tokens}"]


def run_leantrain(args, name: str, out: Path) -> dict:
    train, held_out = data_files(args)
    lora = ["peft.method=lora", f"peft.r={LORA['r']}", f"peft.alpha={LORA['alpha']}", f"peft.dropout={LORA['dropout']}",
            f"peft.target_modules=[{','.join(LORA['targets'])}]"] if name.startswith("lora") else []
    ckpt = ["efficiency.gradient_checkpointing=true"] if name.endswith("_ckpt") else []
    every = ["grpo.skip_zero_advantage=off"] if name.endswith("_every") else []
    summary, result = leantrain_train(
        args, out, f"model.name={MODEL}", f"data.train={train}", f"data.eval={held_out}", "data.max_eval_samples=4",
        "data.batching=dynamic", f"train.batch_size={args.prompts}", f"train.micro_batch_size={args.prompts}",
        "train.epochs=1", f"train.lr={args.lr_lora if lora else args.lr_full}", "optim.warmup_ratio=0",
        "optim.weight_decay=0", f"train.seed={SEED}", "train.log_every_steps=1", *grpo_overrides(args),
        f"grpo.num_generations={args.generations}", "grpo.loss=dapo", "grpo.beta=0", "grpo.temperature=1.0",
        "report.plots=false", "report.progress=plain", "checkpoint.every_steps=0", *lora, *ckpt, *every,
        *args.leantrain_set)
    tr = summary["train"]
    records = [json.loads(line) for line in open(out / "run" / "metrics.jsonl")]
    rewards = [r["reward"] for r in records if r.get("type") == "train" and "reward" in r]
    split = tr.get("time_split_seconds") or {}
    return {**result, "trainable_parameters": summary["model"]["trainable_parameters"], "tokens": tr["tokens_seen"],
            "leantrain_tokens_per_second": tr["tokens_per_second"], "time_split_seconds": split,
            "train_reward": sum(rewards) / len(rewards) if rewards else None}


def held_out(args, model: str, out: Path) -> float:
    """``leantrain eval`` of ``model`` on the held-out prompts: the mean greedy reward."""
    _, prompts = data_files(args)
    return leantrain_eval(model, [f"data.eval={prompts}", *grpo_overrides(args)], out)["reward"]


def worker(args) -> None:
    from leantrain.modeling.names import resolve_model_name

    run_worker(args, lambda out: run_trl(args, args.worker == "trl_full", out) if args.worker.startswith("trl")
               else run_leantrain(args, args.worker, out),
               lambda r: {"tokens_per_second": r["tokens"] / r["loop_seconds"],
                          "seconds_per_step": r["loop_seconds"] / r["steps"]},
               lambda model, out: {"held_out_reward": held_out(args, model, out)}, base=resolve_model_name(MODEL))


# ------------------------------------------------------------------------------------------------ driver


def main() -> None:
    p = script_parser(__doc__)
    p.add_argument("--prompts", type=int, default=4, help="prompts per optimizer step (one micro-batch)")
    p.add_argument("--generations", type=int, default=8, help="completions per prompt")
    p.add_argument("--new-tokens", type=int, default=16, help="new tokens at most per completion")
    p.add_argument("--prompt-set", choices=["arithmetic", "word-problems"], default="arithmetic",
                   help="the prompts: arithmetic (short answers) or word-problems (reasoning: long completions)")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps (one epoch of steps x prompts prompts)")
    p.add_argument("--eval-rows", type=int, default=100, help="held-out prompts for the greedy reward")
    p.add_argument("--lr-full", type=float, default=3e-5, help="lr of the full fine-tunes (examples/grpo-arithmetic"
                   ".yaml's; the rounds of 2026-12-02/03 ran 5e-6, at which neither tool moved the held-out reward)")
    p.add_argument("--lr-lora", type=float, default=3e-4, help="lr of the LoRA runs (10x, as in dpo_vs_trl)")
    p.add_argument("--leantrain-set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for every leantrain contender (repeatable), e.g. efficiency.gradient_checkpointing=true")
    bench_main(__spec__.name, p, CONTENDERS, "/tmp/leantrain-grpo-bench", "grpo", "no held-out reward", worker, table)


def table(results: dict[str, list[dict]]) -> str:
    med = functools.partial(median, results)
    ratio = functools.partial(ratio_of, results)

    rows = ["| contender | trainable params | peak memory (GiB) | tokens/s (median; per round) | s / step | vs TRL "
            "tokens/s | vs TRL peak | where the time goes, round 1 (s) | train reward | held-out reward |",
            "|---" * 10 + "|"]
    for name in results:
        reward = med(name, "held_out_reward")
        shown = f"{reward:.3f}" if reward is not None else ""
        if med(name, "tokens_per_second") is None:
            if reward is not None:
                rows.append(f"| {name} (not trained) | | | | | | | | | {shown} |")
            continue
        base = "trl_full" if "full" in name else "trl_lora"
        per_round = ", ".join(f"{r['tokens_per_second']:.1f}" for r in results[name])
        rows.append(
            f"| {name} | {med(name, 'trainable_parameters'):,.0f} | {med(name, 'peak_memory_bytes') / 2**30:.2f} | "
            f"{med(name, 'tokens_per_second'):.1f} ({per_round}) | {med(name, 'seconds_per_step'):.1f} | "
            f"{ratio(name, 'tokens_per_second', base)} | {ratio(name, 'peak_memory_bytes', base)} | "
            f"{time_split(results[name])} | {med(name, 'train_reward'):.3f} | {shown} |")
    return "\n".join(rows)


def time_split(rounds: list[dict]) -> str:
    """The first round's seconds of generation / scoring / training (TRL's, timed around its methods), or
    leantrain's own time split."""
    r = rounds[0]
    if "generation_seconds" in r:
        return (f"generation {r['generation_seconds']:.0f}, scoring {r['scoring_seconds']:.1f}, "
                f"training {r['training_seconds']:.0f}")
    return ", ".join(f"{k} {v:.0f}" for k, v in r.get("time_split_seconds", {}).items())


if __name__ == "__main__":
    main()
