"""Instruction tuning, what each way of training costs: SmolLM2-135M on Alpaca, full fine-tune vs LoRA vs freezing
in leantrain, and leantrain's LoRA against TRL's SFTTrainer with the same LoRA.

    python -m benchmarks.against.sft_vs_trl                                        # 160 rows, 2 interleaved rounds (about 45 min on 2 cores)
    python -m benchmarks.against.sft_vs_trl --rows 48 --eval-rows 32 --repeats 1   # a smoke run (minutes)
    python -m benchmarks.against.sft_vs_trl --json out.json --results benchmarks/results/instruction-tuning.md

Needs TRL beside leantrain's environment: `pip install -e '.[bench]' -c constraints.txt` (TRL 1.16 installs beside
torch 2.13; it is not a leantrain dependency).

Job: the pretrained SmolLM2-135M-Instruct (the `smollm2-135m` preset), the first --rows rows of
../shared/data/alpaca_5k/train.jsonl (CC BY-NC 4.0: read in place, benchmark use only), rendered with the model's chat
template, loss on the responses only, sequences of at most 512 tokens, one epoch, AdamW (the Trainer's fused AdamW /
leantrain's default), linear decay without warm-up, weight decay 0.01, clipping 1.0, bf16 autocast over fp32 weights (where the CPU runs bf16
natively), seed 0. Every contender runs in a fresh process (peak memory is per process), interleaved (A B C ... A B C
...) over --repeats rounds; medians.

Contenders (lr 2e-4 for LoRA, 2e-5 for the full model and the frozen one; LoRA r=16, alpha 32, dropout 0.05 on
q/k/v/o/gate/up/down_proj everywhere):
  trl_lora          TRL's SFTTrainer + peft with its defaults for prompt-completion data: completion-only loss,
                    gradient checkpointing, its fused (chunked) output layer, batches of 4 examples padded to their
                    longest, 4 accumulated per optimizer step (about the tokens of 4 packed blocks of 512)
  trl_lora_packed   the same with TRL's best switch for this: packing=True (best-fit decreasing into 512-token rows,
                    padding-free, position ids restart per example), 4 packed rows per optimizer step
  lora              leantrain peft.method=lora, its defaults (data.packing=auto: packed blocks of 512, no gradient
                    checkpointing, chunked loss), 4 blocks a step
  lora_ckpt         the same with efficiency.gradient_checkpointing=true: trl_lora_packed's settings
  full              leantrain, the whole model trained, 4 blocks a step
  freeze            leantrain, model.freeze=[embeddings, model.layers.0-14] (the lower half; the tied output layer
                    shares the embedding's weight and is frozen with it), 4 blocks a step

Measured, the same way for every contender: target tokens/s = the response tokens of the --rows rows (counted once,
by leantrain's rendering) / the seconds of the training loop; wall seconds of the whole process up to the trained
model (start, load, data, train; no saving; leantrain's end-of-run evaluation of 8 held-out rows, which it
runs when given data.eval, is in the wall time but not in the loop's: without data.eval it would hold out 10% of
the training rows); peak memory = CUDA max allocated on a GPU, else the process's peak RSS
(VmHWM) at the end of training; trainable parameters; the optimizer's state bytes (summed over its tensors); eval loss
= `leantrain eval <model> data.eval=eval.jsonl` on the merged model (the mean cross-entropy over the response tokens of
the --eval-rows held-out rows, fp32), computed in the first round only (training is seeded, so the rounds train the
same model). The base model's eval loss is the `base` row. Not a test.
"""

from __future__ import annotations

import json
import functools
import time
from pathlib import Path

from benchmarks.driver.jobs import DATA
from benchmarks.driver.measure import default_precision, peak_bytes
from benchmarks.driver.rounds import driver_arguments, fresh_rounds
from benchmarks.driver.tables import median, ratio as ratio_of
from benchmarks.driver.trl import leantrain_eval, leantrain_train, loop_clock, run_worker, script_parser

START = time.perf_counter()
ALPACA = DATA / "alpaca_5k"
CONTENDERS = ["trl_lora", "trl_lora_packed", "lora", "lora_ckpt", "full", "freeze"]
MODEL, BLOCK, MICRO, SEED = "smollm2-135m", 512, 4, 0
LORA = {"r": 16, "alpha": 32, "dropout": 0.05,
        "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
LR = {"trl_lora": 2e-4, "trl_lora_packed": 2e-4, "lora": 2e-4, "lora_ckpt": 2e-4, "full": 2e-5, "freeze": 2e-5}


def head_file(src: Path, rows: int, out: Path) -> Path:
    """The first ``rows`` rows of ``src`` in the work folder (outside the repository)."""
    if not out.exists():
        with open(src) as f:
            out.write_text("".join(line for _, line in zip(range(rows), f)))
    return out


def data_files(args) -> tuple[Path, Path]:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    return (head_file(ALPACA / "train.jsonl", args.rows, work / f"train_{args.rows}.jsonl"),
            head_file(ALPACA / "eval.jsonl", args.eval_rows, work / f"eval_{args.eval_rows}.jsonl"))


def target_tokens(train: Path, tokenizer) -> int:
    """The response tokens of the training rows, as leantrain renders them: the count every contender is timed on."""
    import datasets

    from leantrain.data.lm import instructions as ins

    rows = [json.loads(line) for line in open(train)]
    return int(sum(ins.process(datasets.Dataset.from_list(rows), tokenizer, block_size=BLOCK).dataset["targets"]))


# ------------------------------------------------------------------------------------------------ contenders


def run_trl(args, packed: bool, out: Path) -> dict:
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from leantrain.data.lm.instruction_formats import detect_format, to_messages
    from leantrain.modeling.names import resolve_model_name
    from leantrain.optim import state_bytes
    train, _ = data_files(args)
    path = resolve_model_name(MODEL)
    tok = AutoTokenizer.from_pretrained(path)
    rows = [json.loads(line) for line in open(train)]
    fmt = detect_format(list(rows[0]))
    pairs = []
    for row in rows:  # the same messages leantrain renders, as TRL's conversational prompt-completion rows
        messages = to_messages(row, fmt)
        pairs.append({"prompt": messages[:-1], "completion": messages[-1:]})
    stamps: list[float] = []

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = SFTConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=MICRO, gradient_accumulation_steps=1 if packed else 4,
        num_train_epochs=1, learning_rate=LR["trl_lora"], lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.01,
        max_grad_norm=1.0,
        max_length=BLOCK, packing=packed, bf16=default_precision() == "bf16", seed=SEED, logging_strategy="no",
        save_strategy="no", report_to=[], dataloader_num_workers=0, disable_tqdm=True,
        use_cpu=not torch.cuda.is_available())
    lora = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                      target_modules=LORA["targets"], task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=config, train_dataset=datasets.Dataset.from_list(pairs),
                         processing_class=tok, peft_config=lora, callbacks=[loop_clock(stamps)])
    trainer.train()
    result = {"loop_seconds": stamps[-1] - stamps[0], "wall_seconds": time.perf_counter() - START,
              "peak_memory_bytes": peak_bytes(), "steps": trainer.state.global_step,
              "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
              "optimizer_state_bytes": state_bytes(trainer.optimizer),
              "target_tokens": target_tokens(train, tok)}
    if args.eval_now:
        merged = trainer.model.merge_and_unload()
        merged.save_pretrained(out / "model")
        tok.save_pretrained(out / "model")
    return result


def run_leantrain(args, name: str, out: Path) -> dict:
    from transformers import AutoConfig, AutoTokenizer

    from leantrain.modeling.names import resolve_model_name

    train, _ = data_files(args)
    check = head_file(ALPACA / "eval.jsonl", 8, Path(args.workdir) / "eval_8.jsonl")  # else 10% of train is held out
    path = resolve_model_name(MODEL)
    lora = ["peft.method=lora", f"peft.r={LORA['r']}", f"peft.alpha={LORA['alpha']}", f"peft.dropout={LORA['dropout']}",
            f"peft.target_modules=[{','.join(LORA['targets'])}]"]
    extra = {"lora": lora, "lora_ckpt": [*lora, "efficiency.gradient_checkpointing=true"],
             "freeze": [f"model.freeze=[embeddings,model.layers.0-{AutoConfig.from_pretrained(path).num_hidden_layers // 2 - 1}]"],
             "full": []}[name]
    summary, result = leantrain_train(
        args, out, f"model.name={MODEL}", f"data.train={train}", f"data.eval={check}", f"data.block_size={BLOCK}",
        f"train.batch_size={MICRO}", f"train.micro_batch_size={MICRO}", "train.epochs=1", f"train.lr={LR[name]}",
        "optim.warmup_ratio=0", f"train.seed={SEED}", "report.plots=false", "report.progress=plain",
        "checkpoint.every_steps=0", *extra)
    tr = summary["train"]
    return {**result, "trainable_parameters": summary["model"]["trainable_parameters"],
            "optimizer_state_bytes": summary["optim"]["state_bytes"],
            "tokens_trained": tr["tokens_seen"], "target_tokens": target_tokens(train, AutoTokenizer.from_pretrained(path))}


def eval_loss(args, model: str, out: Path) -> float:
    """``leantrain eval`` of ``model`` (a folder or the preset) on the held-out rows: the mean over response tokens."""
    _, held_out = data_files(args)
    return leantrain_eval(model, [f"data.eval={held_out}", f"data.block_size={BLOCK}"], out)["loss"]


def worker(args) -> None:
    run_worker(args, lambda out: run_trl(args, args.worker == "trl_lora_packed", out) if args.worker.startswith("trl")
               else run_leantrain(args, args.worker, out),
               lambda r: {"tokens_per_second": r["target_tokens"] / r["loop_seconds"]},
               lambda model, out: {"eval_loss": eval_loss(args, model, out)}, base=MODEL)


# ------------------------------------------------------------------------------------------------ driver


def main() -> None:
    p = script_parser(__doc__)
    p.add_argument("--rows", type=int, default=160, help="training rows (the first of train.jsonl), one epoch")
    p.add_argument("--eval-rows", type=int, default=500, help="held-out rows of eval.jsonl (500: all of them)")
    driver_arguments(p, CONTENDERS, "/tmp/leantrain-sft-bench", "sft", "no eval loss (speed and memory only)")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if not args.from_json and args.eval and "base" not in args.only.split(","):
        args.only += ",base"
    fresh_rounds(__spec__.name, args, table, "sft")


def table(results: dict[str, list[dict]]) -> str:
    med = functools.partial(median, results)
    ratio = functools.partial(ratio_of, results)

    base_loss = med("base", "eval_loss")
    rows = [("| contender | trainable params | optimizer state (MB) | peak memory (GiB) | target tokens/s (median; "
             "per round) | vs trl_lora | vs trl_lora_packed | peak vs trl_lora | peak vs trl_lora_packed | wall s | "
             "steps | eval loss |"), "|---" * 12 + "|"]
    for name in results:
        if name == "base" or med(name, "tokens_per_second") is None:
            continue
        rounds = ", ".join(f"{r['tokens_per_second']:.0f}" for r in results[name])
        rows.append(
            f"| {name} | {med(name, 'trainable_parameters'):,.0f} | {med(name, 'optimizer_state_bytes') / 1e6:.1f} | "
            f"{med(name, 'peak_memory_bytes') / 2**30:.2f} | {med(name, 'tokens_per_second'):.0f} ({rounds}) | "
            f"{ratio(name, 'tokens_per_second', 'trl_lora')} | {ratio(name, 'tokens_per_second', 'trl_lora_packed')} | "
            f"{ratio(name, 'peak_memory_bytes', 'trl_lora')} | {ratio(name, 'peak_memory_bytes', 'trl_lora_packed')} | "
            f"{med(name, 'wall_seconds'):.0f} | {med(name, 'steps'):.0f} | "
            + (f"{med(name, 'eval_loss'):.4f}" if med(name, "eval_loss") is not None else "") + " |")
    if base_loss is not None:
        rows.append(f"| base (untrained) | | | | | | | | | | | {base_loss:.4f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
