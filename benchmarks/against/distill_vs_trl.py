"""Distillation, what it costs: SmolLM2-135M-Instruct distilled on-policy from an SFT-trained SmolLM2 teacher on
two-digit addition, leantrain's model.task=distill against TRL's GKDTrainer (trl.experimental.gkd) at the same
settings.

    python -m benchmarks.against.distill_vs_trl --rows 16 --eval-rows 16 --repeats 1 --only trl,leantrain,base  # smoke
    python -m benchmarks.against.distill_vs_trl --repeats 1 --json out.json       # every contender once (~31 min on 2
                                                                # cores, the _long pair 13 of them; evaluations included)
    python -m benchmarks.against.distill_vs_trl --only trl,leantrain,base --results benchmarks/results/distill.md
    python -m benchmarks.against.distill_vs_trl --from-json out.json --results benchmarks/results/distill.md

Run it under the machine's CPU lock (`flock /tmp/leantrain-cpu.lock python -m ...`); the defaults are 160 rows (20
steps) and 2 interleaved rounds of every contender except the _seed1 and _ckpt ones (--only).

Needs TRL beside leantrain's environment: `pip install -e '.[bench]' -c constraints.txt` (TRL 1.16 installs beside
torch 2.13; it is not a leantrain dependency).

Job: the student is the pretrained SmolLM2-135M-Instruct (the `smollm2-135m` preset; TRL loads the same folder,
`resolve_model_name`, in fp32); the teacher is the folder --teacher (default /work/teachers/arith-sft/model: SmolLM2
SFT-trained on the task; the same folder for both, loaded by each tool its own way: leantrain in the run's compute
dtype, TRL by `from_pretrained(teacher)` with its defaults, i.e. the dtype the folder records). Data: the first --rows
rows of --task/train.jsonl (conversational: `prompt` = a system turn asking for just the number and a user turn
"What is a + b?" with two-digit a and b, `completion`, `answer`) for leantrain, the same rows of sft.jsonl (`messages`,
what TRL's GKD collator reads) for TRL, checked row by row to ask the same questions. One epoch, --prompts prompts an
optimizer step in ONE micro-batch (TRL: per_device_train_batch_size = --prompts, no accumulation; leantrain:
train.batch_size = train.micro_batch_size = --prompts), so --rows / --prompts steps. The same prompts in the same
steps: leantrain orders its epoch by its seed (data.batching=dynamic: a plain seeded permutation), TRL gets the rows
in that order with train_sampling_strategy=sequential (checked: the first prompts of every step, from leantrain's
completions.jsonl and from TRL's batches, are compared and the table says whether they agree). Settings for both:
on-policy only (lmbda 1: every step trains on the student's own samples), the generalised JSD with --beta (1: the
reverse KL(student || teacher)), temperature 1.0 (sampling and loss), top_p 1, top_k off, at most --new-tokens new
tokens, AdamW lr --lr, linear decay without warm-up, weight decay 0, clipping 1.0, bf16 autocast over fp32 weights
where the CPU runs bf16 natively (`measure.default_precision`; TRL: bf16=True), seed 0, logging every step.

Contenders (a suffix changes one setting of the pair):
  trl            GKDTrainer, its defaults otherwise: gradient checkpointing on (GKD then generates with
                 use_cache=False: transformers' generate with no KV cache, checkpointing switched off for it), the
                 teacher loaded by GKDTrainer from the folder, the full student and teacher logits of every position
                 of prompt + completion, dropout disabled, its loss divided by the step's count of the DATA's
                 completion tokens (Trainer's num_items_in_batch, counted before the on-policy generation replaces
                 them: recorded as `trl_loss_divisor_ratio`, the divisor over the trained tokens)
  leantrain      leantrain model.task=distill, its defaults otherwise (no gradient checkpointing; its own decode loop
                 with a KV cache; the teacher's and student's output-layer inputs on the completion positions only,
                 the divergence in checkpointed chunks; model.save_dtype=float32 so that the evaluated model holds
                 the trained fp32 weights, as TRL's save does)
  trl_jsd, leantrain_jsd     beta --jsd-beta (0.5, TRL's default): the generalised JSD
  trl_long, leantrain_long   at most --long-tokens (64) new tokens
  trl_seed1, leantrain_seed1 seed 1 (the seed-to-seed spread of the held-out numbers: what "within noise" means)
  leantrain_ckpt leantrain with efficiency.gradient_checkpointing=true (TRL's default; compared with trl; no
                 held-out evaluation: the same training as leantrain's)
  base           no training: the untrained student's held-out numbers (at --new-tokens, and at --long-tokens when a
                 _long contender runs)

Measured, the same way for every contender: tokens/s = the prompt + completion tokens of the rows trained on (prompt
tokens without padding, completion tokens up to and including the first EOS) over the seconds of the training loop,
generation included: leantrain's `train.tokens_seen` over `train.loop_seconds` of summary.json; TRL's counted by the
script from the batch each `compute_loss` receives after the on-policy generation (its attention mask: the prompt's
mask + the completion's, up to the EOS), over its `train()` loop (`driver.trl.loop_clock`). The prompt tokens alone
are reported too (leantrain's: tokens_seen less the completions' lengths of metrics.jsonl): equal when both tools
tokenize the same rows alike. s / step; peak memory = the process's peak RSS (VmHWM) at the end of training (CUDA max
allocated on a GPU); where the time goes: TRL's seconds inside `generate_on_policy_outputs` (generation) and the
teacher's forward (timed by wrapping them), the rest of its loop being the student's forward, backward, optimizer
and logging; leantrain's `train.time_split_seconds`; the mean training divergence per completion token over the steps
(TRL's loss rescaled to the trained tokens' count). Held out, ONE evaluator for every model: `leantrain eval <model>
model.task=distill distill.teacher=<teacher> distill.max_new_tokens=<the row's> distill.beta=1 efficiency.precision=
<the runs'> grpo.rewards=[numeric:answer] data.eval=<the first --eval-rows of eval.jsonl>` on each trained model
(TRL's saved by save_pretrained, leantrain's model/), first round only (training is seeded): greedy completions by
the student, the reverse KL(student || teacher) and forward KL per completion token at temperature 1 on the whole
vocabulary, and the reward (1 when the completion's last number is the answer). Not a test.
"""

from __future__ import annotations

import functools
import json
import re
import time
from pathlib import Path

from benchmarks.driver.measure import default_precision, peak_bytes
from benchmarks.driver.tables import median
from benchmarks.driver.tables import ratio as ratio_of
from benchmarks.driver.trl import (
    bench_main,
    leantrain_eval,
    leantrain_train,
    loop_clock,
    run_worker,
    script_parser,
)

START = time.perf_counter()
CONTENDERS = ["trl", "leantrain", "trl_jsd", "leantrain_jsd", "trl_long", "leantrain_long", "base"]  # _seed1: --only
MODEL, SEED, REWARD = "smollm2-135m", 0, "numeric:answer"
TEACHER, TASK = "/work/teachers/arith-sft/model", "/work/teachers/task"
QUESTION = re.compile(r"What is \d+ \+ \d+\?")
STEP_PROMPTS = 4  # the first prompts of each step compared between the tools (leantrain logs 4 a step)


def settings(args, name: str) -> tuple[float, int, int]:
    """(beta, max new tokens, seed) of contender ``name``."""
    if name.endswith("_jsd"):
        return args.jsd_beta, args.new_tokens, SEED
    if name.endswith("_long"):
        return args.beta, args.long_tokens, SEED
    if name.endswith("_seed1"):
        return args.beta, args.new_tokens, SEED + 1
    return args.beta, args.new_tokens, SEED


def teacher_folder(args) -> str:
    """--teacher, or (not there yet) the student's own folder, said so."""
    if Path(args.teacher, "config.json").exists():
        return args.teacher
    from leantrain.modeling.names import resolve_model_name

    print(f"distill_vs_trl: no teacher at {args.teacher}; the student's own folder is the teacher", flush=True)
    return resolve_model_name(MODEL)


def head(src: Path, rows: int, out: Path) -> Path:
    """The first ``rows`` lines of ``src`` written to ``out``."""
    out.write_text("".join(line + "\n" for line in src.read_text().splitlines()[:rows]))
    return out


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def data_files(args) -> tuple[Path, Path, Path]:
    """(leantrain's training rows, TRL's: the same rows as `messages`, the held-out rows) in the work folder; the two
    training files checked to hold the same conversations row by row."""
    task, work = Path(args.task), Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    train = head(task / "train.jsonl", args.rows, work / f"train_{args.rows}.jsonl")
    sft = head(task / "sft.jsonl", args.rows, work / f"sft_{args.rows}.jsonl")
    held_out = head(task / "eval.jsonl", args.eval_rows, work / f"eval_{args.eval_rows}.jsonl")
    conversations, messages = jsonl(train), jsonl(sft)
    for i, (a, b) in enumerate(zip(conversations, messages, strict=True)):
        if a["prompt"] + a["completion"] != b["messages"]:
            raise SystemExit(f"row {i}: train.jsonl's prompt + completion is not sft.jsonl's messages")
    if len(conversations) != args.rows:
        raise SystemExit(f"--rows {args.rows}: {task / 'train.jsonl'} has fewer rows")
    return train, sft, held_out


def leantrain_order(n: int, seed: int = SEED) -> list[int]:
    """The order in which leantrain's one epoch visits ``n`` rows under data.batching=dynamic (a plain seeded
    permutation of ``seed``, ``data.batching.epoch_batches``), so TRL can be given the same prompts in the same steps."""
    from leantrain.data.batching import epoch_batches

    return [int(i) for b in epoch_batches([1] * n, 1, seed=seed, epoch=0, batching="dynamic") for i in b]


def question(text: str) -> str:
    found = QUESTION.findall(text)
    return found[-1] if found else text[-40:]


# ------------------------------------------------------------------------------------------------ contenders


class Timed:
    """Seconds spent inside wrapped callables, by key."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def wrap(self, key: str, fn):
        self.seconds.setdefault(key, 0.0)

        @functools.wraps(fn)
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[key] += time.perf_counter() - t0
        return wrapper


def run_trl(args, name: str, out: Path) -> dict:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from leantrain.modeling.names import resolve_model_name

    beta, new_tokens, seed = settings(args, name)
    _, sft, _ = data_files(args)
    rows = jsonl(sft)
    rows = [rows[i] for i in leantrain_order(len(rows), seed)]
    path = resolve_model_name(MODEL)
    tok = AutoTokenizer.from_pretrained(path)
    stamps: list[float] = []
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = GKDConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=args.prompts, gradient_accumulation_steps=1,
        num_train_epochs=1, lmbda=1.0, beta=beta, temperature=1.0, max_new_tokens=new_tokens, seq_kd=False,
        learning_rate=args.lr, lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        train_sampling_strategy="sequential", bf16=default_precision() == "bf16", seed=seed, logging_steps=1,
        save_strategy="no", report_to=[], dataloader_num_workers=0, disable_tqdm=True,
        use_cpu=not torch.cuda.is_available())
    trainer = GKDTrainer(model=model, teacher_model=args.teacher_folder, args=config,
                         train_dataset=datasets.Dataset.from_list(rows), processing_class=tok,
                         callbacks=[loop_clock(stamps)])
    timer = Timed()
    trainer.generate_on_policy_outputs = timer.wrap("generation", GKDTrainer.generate_on_policy_outputs)
    trainer.teacher_model.forward = timer.wrap("teacher", trainer.teacher_model.forward)
    counts = {"tokens": 0, "prompt_tokens": 0, "divisor": 0.0, "trained": 0, "steps": []}
    compute_loss = trainer.compute_loss

    def counted(model, inputs, return_outputs=False, num_items_in_batch=None):
        """The tokens of the batch as trained (after the generation), the step's divisor and loss per token."""
        prompt = int(inputs["prompt_attention_mask"].sum())
        counts["tokens"] += int(inputs["attention_mask"].sum())
        counts["prompt_tokens"] += prompt
        trained = int((inputs["labels"][:, 1:] != -100).sum())
        divisor = float(num_items_in_batch) if num_items_in_batch is not None else float(trained)
        counts["divisor"] += divisor
        counts["trained"] += trained
        result = compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        loss = result[0] if return_outputs else result
        prompts = tok.batch_decode(inputs["prompts"][:STEP_PROMPTS], skip_special_tokens=True)
        counts["steps"].append({"kl": float(loss.detach()) * divisor / max(trained, 1),
                                "questions": [question(p) for p in prompts]})
        return result

    trainer.compute_loss = counted
    trainer.train()
    loop = stamps[-1] - stamps[0]
    split = {k: round(v, 2) for k, v in timer.seconds.items()}
    split["rest"] = round(loop - sum(timer.seconds.values()), 2)
    kls = [s["kl"] for s in counts["steps"]]
    result = {"loop_seconds": loop, "wall_seconds": time.perf_counter() - START, "peak_memory_bytes": peak_bytes(),
              "steps": trainer.state.global_step, "tokens": counts["tokens"], "prompt_tokens": counts["prompt_tokens"],
              "time_split_seconds": split, "train_kl": sum(kls) / len(kls),
              "trl_loss_divisor_ratio": counts["divisor"] / max(counts["trained"], 1),
              "teacher_dtype": str(next(trainer.teacher_model.parameters()).dtype).removeprefix("torch."),
              "gradient_checkpointing": bool(config.gradient_checkpointing),
              "step_questions": [s["questions"] for s in counts["steps"]]}
    if args.eval_now:
        trainer.model.save_pretrained(out / "model")
        tok.save_pretrained(out / "model")
    return result


def run_leantrain(args, name: str, out: Path) -> dict:
    beta, new_tokens, seed = settings(args, name)
    train, _, held_out = data_files(args)
    summary, result = leantrain_train(
        args, out, f"model.name={MODEL}", "model.task=distill", f"distill.teacher={args.teacher_folder}",
        "distill.lmbda=1", f"distill.beta={beta}", "distill.temperature=1.0", f"distill.max_new_tokens={new_tokens}",
        f"data.train={train}", f"data.eval={held_out}", "data.max_eval_samples=4", "data.batching=dynamic",
        f"train.batch_size={args.prompts}", f"train.micro_batch_size={args.prompts}", "train.epochs=1",
        f"train.lr={args.lr}", "optim.warmup_ratio=0", "optim.weight_decay=0", "train.max_grad_norm=1.0",
        f"train.seed={seed}", "train.log_every_steps=1", "model.save_dtype=float32", "report.plots=false",
        "report.progress=plain", "checkpoint.every_steps=0",
        *(["efficiency.gradient_checkpointing=true"] if name.endswith("_ckpt") else []), *args.leantrain_set)
    tr = summary["train"]
    records = jsonl(out / "run" / "metrics.jsonl")
    steps = [r for r in records if r.get("type") == "train"]
    completion_tokens = sum(round(r["completions/mean_length"] * args.prompts) for r in steps)
    questions: dict[int, list[str]] = {}
    completions = out / "run" / "completions.jsonl"
    for r in jsonl(completions) if completions.exists() else ():
        questions.setdefault(r["step"], []).append(question(json.dumps(r["prompt"])))
    return {**result, "tokens": tr["tokens_seen"], "prompt_tokens": tr["tokens_seen"] - completion_tokens,
            "leantrain_tokens_per_second": tr["tokens_per_second"], "time_split_seconds": tr.get("time_split_seconds"),
            "train_kl": sum(r["kl"] for r in steps) / len(steps), "precision": summary["efficiency"]["precision"],
            "paths": {k: v.get("value") for k, v in (summary.get("paths") or {}).items() if isinstance(v, dict)},
            "step_questions": [questions.get(s, [])[:STEP_PROMPTS] for s in sorted(questions)]}


def held_out(args, name: str, model: str, out: Path) -> dict:
    """``leantrain eval`` of ``model`` against the teacher on the held-out prompts at the row's max new tokens (the
    base model: at each length a contender of this run trains at)."""
    if name.endswith("_ckpt"):
        return {}
    _, _, prompts = data_files(args)
    lengths = [settings(args, name)[1]] if name != "base" else sorted(
        {settings(args, n)[1] for n in args.only.split(",") if n != "base"} or {args.new_tokens})
    result = {}
    for n in lengths:
        ev = leantrain_eval(model, [
            "model.task=distill", f"distill.teacher={args.teacher_folder}", f"distill.max_new_tokens={n}",
            "distill.beta=1", "distill.temperature=1.0", f"grpo.rewards=[{REWARD}]", f"data.eval={prompts}",
            f"efficiency.precision={default_precision()}"], out)
        suffix = "" if n == args.new_tokens else f"_{n}"
        result.update({f"held_out_{k}{suffix}": ev.get(k) for k in ("reverse_kl", "forward_kl", "reward",
                                                                       "student_logp", "teacher_logp", "tokens")})
    return result


def worker(args) -> None:
    from leantrain.modeling.names import resolve_model_name

    args.teacher_folder = teacher_folder(args)
    run_worker(args, lambda out: run_trl(args, args.worker, out) if args.worker.startswith("trl")
               else run_leantrain(args, args.worker, out),
               lambda r: {"tokens_per_second": r["tokens"] / r["loop_seconds"],
                          "seconds_per_step": r["loop_seconds"] / r["steps"]},
               lambda model, out: held_out(args, args.worker, model, out), base=resolve_model_name(MODEL))


# ------------------------------------------------------------------------------------------------ driver


def main() -> None:
    p = script_parser(__doc__)
    p.add_argument("--teacher", default=TEACHER, help="the teacher's folder (not there: the student's own)")
    p.add_argument("--task", default=TASK, help="the folder of train.jsonl, sft.jsonl, eval.jsonl")
    p.add_argument("--rows", type=int, default=160, help="training rows (the first of train.jsonl), one epoch")
    p.add_argument("--prompts", type=int, default=8, help="prompts per optimizer step (one micro-batch)")
    p.add_argument("--eval-rows", type=int, default=200, help="held-out prompts (200: all of eval.jsonl)")
    p.add_argument("--beta", type=float, default=1.0, help="the divergence (1: reverse KL)")
    p.add_argument("--jsd-beta", type=float, default=0.5, help="beta of the _jsd pair (0.5: TRL's default)")
    p.add_argument("--new-tokens", type=int, default=16, help="max new tokens a completion")
    p.add_argument("--long-tokens", type=int, default=64, help="max new tokens of the _long pair")
    p.add_argument("--lr", type=float, default=1e-5, help="AdamW's peak lr, both tools")
    p.add_argument("--leantrain-set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for every leantrain contender (repeatable)")
    bench_main(__spec__.name, p, CONTENDERS, "/tmp/leantrain-distill-bench", "distill",
               "no held-out evaluation", worker, table)


def table(results: dict[str, list[dict]]) -> str:
    med = functools.partial(median, results)
    ratio = functools.partial(ratio_of, results)

    def shown(value, fmt: str = "{:.4f}") -> str:
        return fmt.format(value) if value is not None else ""

    rows = [("| contender | peak memory (GiB) | tokens/s (median; per round) | s / step | vs TRL tokens/s | vs TRL peak "
             "| prompt tokens | where the time goes, round 1 (s) | train divergence / token | held-out reverse KL | "
             "held-out forward KL | held-out reward |"), "|---" * 12 + "|"]
    for name, rounds in results.items():
        if not rounds:
            continue
        if name == "base":
            r = rounds[0]
            for key in sorted(k for k in r if k.startswith("held_out_reverse_kl")):
                suffix = key.removeprefix("held_out_reverse_kl")
                rows.append(f"| base (not trained){' at ' + suffix[1:] + ' tokens' if suffix else ''} | | | | | | | |"
                            f" | {shown(r.get(key))} | {shown(r.get('held_out_forward_kl' + suffix))} | "
                            f"{shown(r.get('held_out_reward' + suffix), '{:.3f}')} |")
            continue
        twin = twin_of(results, name)
        per_round = ", ".join(f"{r['tokens_per_second']:.1f}" for r in rounds)
        first = rounds[0]
        split = ", ".join(f"{k} {v:.1f}" for k, v in (first.get("time_split_seconds") or {}).items() if v >= 0.05)
        suffix = next((f"_{k.rsplit('_', 1)[1]}" for k in first if k.startswith("held_out_reverse_kl_")), "")
        rows.append(
            f"| {name} | {med(name, 'peak_memory_bytes') / 2**30:.2f} | {med(name, 'tokens_per_second'):.1f} "
            f"({per_round}) | {med(name, 'seconds_per_step'):.2f} | {ratio(name, 'tokens_per_second', twin)} | "
            f"{ratio(name, 'peak_memory_bytes', twin)} | {first['prompt_tokens']} | {split} | "
            f"{med(name, 'train_kl'):.4f} | {shown(med(name, 'held_out_reverse_kl' + suffix))} | "
            f"{shown(med(name, 'held_out_forward_kl' + suffix))} | {shown(med(name, 'held_out_reward' + suffix), '{:.3f}')} |")
    notes = []
    for name, rounds in results.items():
        twin = twin_of(results, name)
        if name.startswith("leantrain") and rounds and results.get(twin) and not name.endswith("_ckpt"):
            seen = {json.dumps(r.get("step_questions")) for r in rounds + results[twin]}
            notes.append(f"{name} / {twin}: the first {STEP_PROMPTS} prompts of every step "
                         f"{'agree' if len(seen) == 1 else 'DIFFER'} (all rounds)")
        if name.startswith("trl") and rounds and "trl_loss_divisor_ratio" in rounds[0]:
            divisor = ", ".join(f"{r['trl_loss_divisor_ratio']:.3f}" for r in rounds)
            notes.append(f"{name}: TRL's loss divisor / the completion tokens it trains on = {divisor}")
    return "\n".join(rows) + ("\n\n" + "; ".join(notes) + "." if notes else "")


def twin_of(results: dict[str, list[dict]], name: str) -> str:
    """The TRL contender a leantrain one is compared with: the same suffix (leantrain_jsd: trl_jsd), else trl."""
    if not name.startswith("leantrain"):
        return name
    twin = "trl" + name.removeprefix("leantrain")
    return twin if results.get(twin) else "trl"


if __name__ == "__main__":
    main()
