"""Reward model, what it costs: the packaged MiniLM trained on HH-RLHF pairs, leantrain (model.task=reward-model,
detected from the chosen/rejected data on a sequence classifier) against TRL's RewardTrainer.

    python -m benchmarks.against.rm_vs_trl                                   # 384 pairs, 2 interleaved rounds
    python -m benchmarks.against.rm_vs_trl --rows 32 --eval-rows 32 --repeats 1   # a smoke run
    python -m benchmarks.against.rm_vs_trl --json out.json --results benchmarks/results/reward-model.md
    python -m benchmarks.against.rm_vs_trl --long --rows 128 --eval-rows 100   # long pairs: every sequence 256 tokens

Needs TRL beside leantrain's environment: `pip install -e '.[bench]' -c constraints.txt` (TRL 1.16 installs beside
torch 2.13; it is not a leantrain dependency).

Job: the packaged MiniLM (all-MiniLM-L6-v2, `model.name=minilm`) with one output, the first --rows pairs of
../shared/data/hh_rlhf/train.jsonl (MIT) whose chosen and rejected sequences, as leantrain renders them for a
sequence classifier ([CLS] prompt response [SEP]), are both within --max-length tokens and differ (so neither tool
cuts or drops anything). TRL gets those very token ids (its documented pre-tokenized `chosen_ids` / `rejected_ids`
columns), so both train on the same tokens. Bradley-Terry loss -log sigmoid(r_chosen - r_rejected), no centring;
batch 8 pairs a step (16 sequences, no accumulation), one epoch, AdamW lr 1e-4 (TRL's RewardConfig default), weight
decay 0.01, linear decay without warm-up, clipping 1.0, bf16 autocast over fp32 weights where the CPU runs bf16
natively, seed 0 (--seed). Every contender runs in a fresh process, interleaved (A B C A B C ...) over --repeats
rounds; medians.

Contenders:
  trl          RewardTrainer, its defaults otherwise (gradient checkpointing on, dropout disabled, random order)
  trl_nockpt   the same with gradient_checkpointing=False (TRL's faster switch on a model this small)
  leantrain    leantrain's defaults (model.task=reward-model auto-detected; length-grouped batches; dropout off,
               preference.dropout=off, as RewardTrainer's disable_dropout)
  leantrain_dropout  the same with MiniLM's own dropout kept (preference.dropout=keep). Attention dropout keeps
               torch's CPU SDPA off its fused kernel: ~190 MiB of attention weights and masks kept per layer at
               16 x 256 tokens, about 1.1 GiB of the peak (benchmarks/results/reward-model.md)
  leantrain_random  the same with batches in random order, padded to their longest (data.batching=dynamic), as
               RewardTrainer batches, instead of length-grouped ones
  leantrain_system  the same with glibc's allocator left as it is (efficiency.cpu_allocator=system) instead of
               leantrain's reuse of freed host memory

Measured, the same way for every contender: pairs/s = the --rows pairs / the seconds of the training loop; tokens/s
= their non-padding tokens (chosen + rejected) / the same seconds; wall seconds of the process up to the trained
model; peak memory = CUDA max allocated on a GPU, else the process's peak RSS (VmHWM) at the end of training;
held-out pairwise accuracy (share of pairs whose chosen scores higher; the trivial baseline is 0.5) and mean margin =
`leantrain eval <model> data.eval=<the first --eval-rows pairs of test.jsonl>` in fp32, cut at --max-length as
leantrain cuts (the same evaluator and tokens for both tools; TRL's model is given leantrain's record of the task),
first round only (training is seeded). Not a test.

Long pairs (--long): where the short HH-RLHF pairs let length grouping win, these measure the per-token path. Every
pair of train.jsonl gets the chosen transcripts of the pairs before it in the file (at least 1,500 characters of
them) prepended to both its chosen and its rejected, as earlier turns of the same conversation; the prompt keeps its
last --max-length - 2 - --long-response tokens (data.max_prompt_length, for both tools), the response the rest up to
the cap. The first --rows pairs whose chosen and rejected both fill --max-length tokens (both responses at least
--long-response tokens) and differ are trained on: 798 of the 1,758 at 256 / 24, so every training sequence is 256
tokens and no batch pads. The held-out pairs are test.jsonl's built the same way, all kept (shorter ones too).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmarks.driver.jobs import DATA
from benchmarks.driver.measure import default_precision, peak_bytes
from benchmarks.driver.tables import median, ratio
from benchmarks.driver.trl import bench_main, leantrain_eval, leantrain_train, loop_clock, run_worker, script_parser

START = time.perf_counter()
HH = DATA / "hh_rlhf"
CONTENDERS = ["trl", "trl_nockpt", "leantrain", "leantrain_dropout", "leantrain_random", "leantrain_system"]
OVERRIDES = {"leantrain_dropout": ["preference.dropout=keep"], "leantrain_random": ["data.batching=dynamic"],
             "leantrain_system": ["efficiency.cpu_allocator=system"]}
MODEL, BATCH, LR, WEIGHT_DECAY = "minilm", 8, 1e-4, 0.01
LONG_CONTEXT_CHARS = 1500  # --long: characters of earlier transcripts before each pair (> 256 MiniLM tokens)


def rendered(rows: list[dict], max_length: int, max_prompt: int | None = None):
    """leantrain's reward-model rendering of ``rows`` (implicit HH-RLHF pairs) with a prompt budget of ``max_prompt``
    tokens (default: the whole cap): the encode_scored output, whose flags say which rows would be cut, trimmed or
    dropped."""
    from transformers import AutoTokenizer

    from leantrain.data.lm.preference_render import encode_scored
    from leantrain.modeling.names import resolve_model_name

    tok = AutoTokenizer.from_pretrained(resolve_model_name(MODEL))
    batch = {k: [r[k] for r in rows] for k in ("chosen", "rejected")}
    return encode_scored(batch, tok, "implicit", max_length - 1 if max_prompt is None else max_prompt, max_length)


def prompt_budget(args) -> int:
    """data.max_prompt_length of the job: the whole cap, or with --long the cap less --long-response tokens (and
    [CLS], [SEP]), so that the response keeps at least that many."""
    return args.max_length - 2 - args.long_response if args.long else args.max_length - 1


def with_context(rows: list[dict], chars: int = LONG_CONTEXT_CHARS) -> list[dict]:
    """--long: each pair with the chosen transcripts of the pairs before it (in file order, at least ``chars``
    characters of them) prepended to both its chosen and its rejected, as earlier turns of the same conversation:
    an HH-RLHF transcript still, whose prompt (the shared prefix) is long enough to be trimmed from its start."""
    out = []
    for i, row in enumerate(rows):
        context, j = "", i
        while len(context) < chars and j > 0:
            j -= 1
            context = rows[j]["chosen"] + context
        out.append({k: context + row[k] for k in ("chosen", "rejected")})
    return out


def train_file(args) -> Path:
    """The first --rows pairs of train.jsonl that neither tool cuts, drops or trims, as JSONL (kept in --workdir).
    --long: the first --rows pairs of ``with_context(train.jsonl)`` whose chosen and rejected both fill --max-length
    tokens once the prompt keeps its last ``prompt_budget`` tokens and the response is cut at the cap (and differ)."""
    out = Path(args.workdir) / f"train_{args.rows}_{args.max_length}{'_long' if args.long else ''}.jsonl"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in open(HH / "train.jsonl")]
    rows = with_context(rows) if args.long else rows
    enc = rendered(rows, args.max_length, prompt_budget(args))
    if args.long:
        keep = [r for i, r in enumerate(rows) if not enc["tie"][i] and
                min(len(enc["chosen_input_ids"][i]), len(enc["rejected_input_ids"][i])) == args.max_length]
    else:
        keep = [r for i, r in enumerate(rows) if not (enc["cut"][i] or enc["trimmed"][i] or enc["tie"][i])]
    if len(keep) < args.rows:
        raise SystemExit(f"only {len(keep)} pairs of train.jsonl fit in {args.max_length} tokens")
    out.write_text("".join(json.dumps(r) + "\n" for r in keep[: args.rows]))
    return out


def eval_file(args) -> Path:
    """The first --eval-rows pairs of test.jsonl (--long: of ``with_context(test.jsonl)``, every one of them)."""
    out = Path(args.workdir) / f"eval_{args.eval_rows}{'_long' if args.long else ''}.jsonl"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        rows = [json.loads(line) for line in open(HH / "test.jsonl")][: args.eval_rows]
        out.write_text("".join(json.dumps(r) + "\n" for r in (with_context(rows) if args.long else rows)))
    return out


# ------------------------------------------------------------------------------------------------ contenders


def run_trl(args, checkpointing: bool, out: Path) -> dict:
    import datasets
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    from leantrain.modeling.names import resolve_model_name
    rows = [json.loads(line) for line in open(train_file(args))]
    enc = rendered(rows, args.max_length, prompt_budget(args))
    data = datasets.Dataset.from_dict({"chosen_ids": enc["chosen_input_ids"],
                                       "rejected_ids": enc["rejected_input_ids"]})
    path = resolve_model_name(MODEL)
    tok = AutoTokenizer.from_pretrained(path)
    stamps: list[float] = []
    torch.manual_seed(args.seed)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
    config = RewardConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=BATCH, gradient_accumulation_steps=1,
        num_train_epochs=1, learning_rate=LR, weight_decay=WEIGHT_DECAY, lr_scheduler_type="linear", warmup_steps=0,
        max_grad_norm=1.0, max_length=args.max_length, gradient_checkpointing=checkpointing,
        bf16=default_precision() == "bf16", seed=args.seed, logging_strategy="no", save_strategy="no", report_to=[],
        dataloader_num_workers=0, disable_tqdm=True, use_cpu=not torch.cuda.is_available())
    trainer = RewardTrainer(model=model, args=config, train_dataset=data, processing_class=tok,
                            callbacks=[loop_clock(stamps)])
    if len(trainer.train_dataset) != args.rows:
        raise SystemExit(f"TRL kept {len(trainer.train_dataset)} of {args.rows} pairs")
    trainer.train()
    result = {"loop_seconds": stamps[-1] - stamps[0], "wall_seconds": time.perf_counter() - START,
              "peak_memory_bytes": peak_bytes(), "steps": trainer.state.global_step}
    if args.eval_now:
        trainer.model.save_pretrained(out / "model")
        tok.save_pretrained(out / "model")
        (out / "model" / "leantrain.json").write_text(json.dumps({"task": "reward-model", "data": {}}))
    return result


def run_leantrain(args, out: Path, name: str) -> dict:
    _, result = leantrain_train(
        args, out, f"model.name={MODEL}", f"data.train={train_file(args)}", f"data.eval={eval_file(args)}",
        "data.max_eval_samples=8", f"data.block_size={args.max_length}",
        f"data.max_prompt_length={prompt_budget(args)}", f"train.batch_size={BATCH}",
        f"train.micro_batch_size={BATCH}", "train.epochs=1", f"train.lr={LR}",
        f"optim.weight_decay={WEIGHT_DECAY}", "optim.warmup_ratio=0", f"train.seed={args.seed}",
        "report.plots=false", "report.progress=plain", "checkpoint.every_steps=0", *OVERRIDES.get(name, []))
    task = json.loads((out / "run" / "model" / "leantrain.json").read_text())["task"]
    if task != "reward-model":
        raise SystemExit(f"leantrain ran model.task={task}, not reward-model")
    return result


def worker(args) -> None:
    def speed(result: dict) -> dict:
        enc = rendered([json.loads(line) for line in open(train_file(args))], args.max_length, prompt_budget(args))
        tokens = sum(map(len, enc["chosen_input_ids"])) + sum(map(len, enc["rejected_input_ids"]))
        return {"pairs_per_second": args.rows / result["loop_seconds"],
                "tokens_per_second": tokens / result["loop_seconds"]}

    def evaluation(model: str, out: Path) -> dict:  # on the held-out pairs, fp32, cut as leantrain cuts
        ev = leantrain_eval(model, [f"data.eval={eval_file(args)}", f"data.block_size={args.max_length}",
                                    f"data.max_prompt_length={prompt_budget(args)}", "efficiency.precision=fp32"], out)
        return {"accuracy": ev["accuracy"], "margin": ev["margin"], "eval_pairs": ev.get("samples")}

    run_worker(args, lambda out: run_leantrain(args, out, args.worker) if args.worker.startswith("leantrain")
               else run_trl(args, args.worker == "trl", out), speed, evaluation)


# ------------------------------------------------------------------------------------------------ driver


def main() -> None:
    p = script_parser(__doc__)
    p.add_argument("--rows", type=int, default=384, help="training pairs (the first that fit), one epoch")
    p.add_argument("--eval-rows", type=int, default=300, help="held-out pairs of test.jsonl (300: all of them)")
    p.add_argument("--max-length", type=int, default=256, help="tokens of the longest sequence kept")
    p.add_argument("--long", action="store_true", help="long pairs: every training sequence --max-length tokens "
                   "(earlier transcripts prepended, the prompt trimmed from its start; see with_context)")
    p.add_argument("--long-response", type=int, default=24, help="--long: tokens each response keeps at least "
                   "(pairs with a shorter response are left out of training)")
    p.add_argument("--seed", type=int, default=0, help="both tools' training seed (the score head's initialisation "
                   "and the order of the pairs); another seed shows how far held-out accuracy moves with them alone")
    bench_main(__spec__.name, p, CONTENDERS, "/tmp/leantrain-rm-bench", "rm", "no held-out evaluation", worker, table)


def table(results: dict[str, list[dict]]) -> str:
    def med(name: str, key: str):
        return median(results, name, key)

    rows = ["| contender | peak memory (GiB) | pairs/s (median; per round) | tokens/s | vs trl pairs/s | vs trl_nockpt "
            "pairs/s | peak vs trl | peak vs trl_nockpt | wall s | steps | held-out pairwise accuracy (pairs) | "
            "margin |", "|---" * 12 + "|"]
    for name in results:
        if med(name, "pairs_per_second") is None:
            continue
        per_round = ", ".join(f"{r['pairs_per_second']:.2f}" for r in results[name])
        acc = med(name, "accuracy")
        rows.append(
            f"| {name} | {med(name, 'peak_memory_bytes') / 2**30:.2f} | {med(name, 'pairs_per_second'):.2f} "
            f"({per_round}) | {med(name, 'tokens_per_second'):.0f} | "
            f"{ratio(results, name, 'pairs_per_second', 'trl')} | "
            f"{ratio(results, name, 'pairs_per_second', 'trl_nockpt')} | "
            f"{ratio(results, name, 'peak_memory_bytes', 'trl')} | "
            f"{ratio(results, name, 'peak_memory_bytes', 'trl_nockpt')} | {med(name, 'wall_seconds'):.0f} | "
            f"{med(name, 'steps'):.0f} | "
            + (f"{acc:.3f} ({med(name, 'eval_pairs'):.0f}) | {med(name, 'margin'):.3f} |"
               if acc is not None else " | |"))
    return "\n".join(rows)


if __name__ == "__main__":
    main()
