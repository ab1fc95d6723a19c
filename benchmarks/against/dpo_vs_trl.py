"""DPO, what it costs: SmolLM2-135M-Instruct on HH-RLHF pairs, leantrain against TRL's DPOTrainer, with LoRA (the
reference = the model with its adapters off, in both) and as a full fine-tune with the reference log-probs
precomputed (TRL's precompute_ref_log_probs=True; leantrain's preference.reference=precompute, its default without
LoRA).

    python -m benchmarks.against.dpo_vs_trl                                        # 48 pairs, 2 interleaved rounds
    python -m benchmarks.against.dpo_vs_trl --rows 16 --eval-rows 16 --repeats 1   # a smoke run
    python -m benchmarks.against.dpo_vs_trl --json out.json --results benchmarks/results/dpo.md

Needs TRL beside leantrain's environment: `pip install -e '.[bench]' -c constraints.txt` (TRL 1.16 installs beside
torch 2.13; it is not a leantrain dependency).

Job: the pretrained SmolLM2-135M-Instruct (the `smollm2-135m` preset), the first --rows pairs of
../shared/data/hh_rlhf/train.jsonl (MIT) whose chosen and rejected transcripts are both at most --max-length tokens
(so neither tool cuts anything: their truncation rules differ), split into prompt / chosen / rejected at the last
"\\n\\nAssistant:" (leantrain's implicit-prompt rule; TRL gets the explicit strings), raw text (no chat template, as
HH-RLHF is written), EOS after each response; DPO sigmoid loss, beta 0.1; batch 4 pairs a step (micro-batch 4, no
accumulation), one epoch, AdamW, lr 5e-5 (LoRA) / 5e-6 (full), linear decay without warm-up, clipping 1.0, bf16
autocast over fp32 weights where the CPU runs bf16 natively, seed 0. LoRA r=16, alpha 32, dropout 0.05 on
q/k/v/o/gate/up/down_proj. Every contender runs in a fresh process, interleaved (A B C D A B C D ...) over --repeats
rounds; medians.

Contenders:
  trl_lora   DPOTrainer + peft, its defaults otherwise (gradient checkpointing on, dropout disabled)
  lora       leantrain peft.method=lora, its defaults (reference: adapters off; chunked loss; no checkpointing)
  lora_ckpt  the same with efficiency.gradient_checkpointing=true (TRL's default)
  trl_full   DPOTrainer, the whole model trained, precompute_ref_log_probs=True (a frozen copy is not loaded)
  full       leantrain, the whole model trained (reference: precomputed once and cached; the cache is cleared before
             each run, so the one pass is in the wall time, not in the loop)

Measured, the same way for every contender: tokens/s = the non-padding tokens of the training pairs (chosen +
rejected, counted once by leantrain's rendering) / the seconds of the training loop (TRL's precompute pass runs
before its loop starts, as leantrain's does); pairs/s likewise; wall seconds of the whole process up to the trained
model; peak memory = CUDA max allocated on a GPU, else the process's peak RSS (VmHWM) at the end of training;
held-out reward accuracy and margin = `leantrain eval <model> data.eval=<the --eval-rows held-out pairs>` against
the base model (TRL's merged model is given leantrain's record of its reference), first round only (training is
seeded). Not a test.
"""

from __future__ import annotations

import json
import functools
import time
from pathlib import Path

from benchmarks.driver.jobs import DATA
from benchmarks.driver.measure import default_precision, peak_bytes
from benchmarks.driver.tables import median, ratio as ratio_of
from benchmarks.driver.trl import bench_main, leantrain_eval, leantrain_train, loop_clock, run_worker, script_parser

START = time.perf_counter()
HH = DATA / "hh_rlhf"
CONTENDERS = ["trl_lora", "lora", "lora_ckpt", "trl_full", "full"]
MODEL, MICRO, SEED, BETA = "smollm2-135m", 4, 0, 0.1
LORA = {"r": 16, "alpha": 32, "dropout": 0.05,
        "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
LR = {"trl_lora": 5e-5, "lora": 5e-5, "lora_ckpt": 5e-5, "trl_full": 5e-6, "full": 5e-6}


def short_pairs(src: Path, rows: int, max_length: int, out: Path) -> Path:
    """The first ``rows`` pairs of ``src`` whose two transcripts are at most ``max_length`` tokens, as JSONL."""
    from transformers import AutoTokenizer

    from leantrain.modeling.names import resolve_model_name

    if out.exists():
        return out
    tok = AutoTokenizer.from_pretrained(resolve_model_name(MODEL))
    kept = []
    with open(src) as f:
        for line in f:
            row = json.loads(line)
            if row["chosen"] != row["rejected"] and all(len(tok(row[k])["input_ids"]) < max_length
                                                        for k in ("chosen", "rejected")):
                kept.append(line)
            if len(kept) == rows:
                break
    out.write_text("".join(kept))
    return out


def data_files(args) -> tuple[Path, Path]:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    return (short_pairs(HH / "train.jsonl", args.rows, args.max_length, work / f"train_{args.rows}.jsonl"),
            short_pairs(HH / "test.jsonl", args.eval_rows, args.max_length, work / f"eval_{args.eval_rows}.jsonl"))


def tokens_of(train: Path) -> int:
    """Non-padding tokens of the training pairs (chosen + rejected) as leantrain renders them."""
    from transformers import AutoTokenizer

    from leantrain.config import resolve
    from leantrain.data.modalities import for_modality
    from leantrain.modeling.names import resolve_model_name

    cfg = resolve(None, [f"data.train={train}", f"data.eval={train}", "data.block_size=4096"]).data
    side = for_modality("pairs")
    rows = side.load_and_validate(cfg, seed=0, batch_size=1).train
    out = side.process(rows, AutoTokenizer.from_pretrained(resolve_model_name(MODEL)), cfg, desc="Processing eval")
    return int(sum(len(a) + len(b) for a, b in zip(out["chosen_input_ids"], out["rejected_input_ids"])))


# ------------------------------------------------------------------------------------------------ contenders


def run_trl(args, full: bool, out: Path) -> dict:
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from leantrain.data.lm.preference_formats import to_example
    from leantrain.modeling.names import resolve_model_name
    train, _ = data_files(args)
    path = resolve_model_name(MODEL)
    tok = AutoTokenizer.from_pretrained(path)
    rows = []
    for line in open(train):
        ex = to_example(json.loads(line), "implicit")  # the same split leantrain makes
        rows.append({"prompt": ex.prompt, "chosen": ex.chosen, "rejected": ex.rejected})
    stamps: list[float] = []

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = DPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=MICRO, gradient_accumulation_steps=1,
        num_train_epochs=1, learning_rate=LR["trl_full" if full else "trl_lora"], lr_scheduler_type="linear",
        warmup_steps=0, max_grad_norm=1.0, beta=BETA, max_length=args.max_length * 2,
        precompute_ref_log_probs=full, bf16=default_precision() == "bf16", seed=SEED, logging_strategy="no",
        save_strategy="no", report_to=[], dataloader_num_workers=0, disable_tqdm=True,
        use_cpu=not torch.cuda.is_available())
    lora = None if full else LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                                        target_modules=LORA["targets"], task_type="CAUSAL_LM")
    trainer = DPOTrainer(model=model, args=config, train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=tok, peft_config=lora, callbacks=[loop_clock(stamps)])
    trainer.train()
    result = {"loop_seconds": stamps[-1] - stamps[0], "wall_seconds": time.perf_counter() - START,
              "peak_memory_bytes": peak_bytes(), "steps": trainer.state.global_step,
              "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)}
    if args.eval_now:
        merged = trainer.model if full else trainer.model.merge_and_unload()
        merged.config.update({"preference": {"loss": "dpo", "beta": BETA, "reference": "live",
                                             "reference_model": MODEL}})
        merged.save_pretrained(out / "model")
        tok.save_pretrained(out / "model")
        (out / "model" / "leantrain.json").write_text(json.dumps({"task": "preference", "data": {}}))
    return result


def run_leantrain(args, name: str, out: Path) -> dict:
    train, held_out = data_files(args)
    lora = ["peft.method=lora", f"peft.r={LORA['r']}", f"peft.alpha={LORA['alpha']}", f"peft.dropout={LORA['dropout']}",
            f"peft.target_modules=[{','.join(LORA['targets'])}]"] if name.startswith("lora") else []
    lora += ["efficiency.gradient_checkpointing=true"] if name == "lora_ckpt" else []
    cache = out / "datasets-cache"  # a fresh datasets cache: the reference pass is in every full run
    summary, result = leantrain_train(
        args, out, f"model.name={MODEL}", f"data.train={train}", f"data.eval={held_out}", "data.max_eval_samples=4",
        f"data.block_size={args.max_length}", f"data.max_prompt_length={args.max_length - 1}",
        f"data.cache_dir={cache}", f"train.batch_size={MICRO}", f"train.micro_batch_size={MICRO}", "train.epochs=1",
        f"train.lr={LR[name]}", "optim.warmup_ratio=0", f"train.seed={SEED}", f"preference.beta={BETA}",
        "report.plots=false", "report.progress=plain", "checkpoint.every_steps=0", *lora)
    return {**result, "trainable_parameters": summary["model"]["trainable_parameters"]}


def held_out(args, model: str, out: Path) -> dict:
    """``leantrain eval`` of ``model`` on the held-out pairs: reward accuracy and margin against its reference."""
    _, pairs = data_files(args)
    return leantrain_eval(model, [f"data.eval={pairs}", f"data.block_size={args.max_length}",
                                  f"data.max_prompt_length={args.max_length - 1}"], out)


def worker(args) -> None:
    def speed(result: dict) -> dict:
        tokens = tokens_of(data_files(args)[0])
        return {"tokens_per_second": tokens / result["loop_seconds"], "tokens": tokens,
                "pairs_per_second": args.rows / result["loop_seconds"]}

    def evaluation(model: str, out: Path) -> dict:
        ev = held_out(args, model, out)
        return {"reward_accuracy": ev["reward_accuracy"], "reward_margin": ev["reward_margin"]}

    run_worker(args, lambda out: run_trl(args, args.worker == "trl_full", out) if args.worker.startswith("trl")
               else run_leantrain(args, args.worker, out), speed, evaluation)


# ------------------------------------------------------------------------------------------------ driver


def main() -> None:
    p = script_parser(__doc__)
    p.add_argument("--rows", type=int, default=48, help="training pairs (the first short ones), one epoch")
    p.add_argument("--eval-rows", type=int, default=64, help="held-out pairs (the first short ones of test.jsonl)")
    p.add_argument("--max-length", type=int, default=256, help="tokens of the longest transcript kept")
    bench_main(__spec__.name, p, CONTENDERS, "/tmp/leantrain-dpo-bench", "dpo", "no held-out reward accuracy", worker, table)


def table(results: dict[str, list[dict]]) -> str:
    med = functools.partial(median, results)
    ratio = functools.partial(ratio_of, results)

    rows = ["| contender | trainable params | peak memory (GiB) | tokens/s (median; per round) | pairs/s | vs TRL "
            "tokens/s | vs TRL peak | wall s | steps | held-out reward accuracy | margin |", "|---" * 11 + "|"]
    for name in results:
        if med(name, "tokens_per_second") is None:
            continue
        base = "trl_full" if "full" in name else "trl_lora"
        per_round = ", ".join(f"{r['tokens_per_second']:.1f}" for r in results[name])
        acc, margin = med(name, "reward_accuracy"), med(name, "reward_margin")
        rows.append(
            f"| {name} | {med(name, 'trainable_parameters'):,.0f} | {med(name, 'peak_memory_bytes') / 2**30:.2f} | "
            f"{med(name, 'tokens_per_second'):.1f} ({per_round}) | {med(name, 'pairs_per_second'):.3f} | "
            f"{ratio(name, 'tokens_per_second', base)} | {ratio(name, 'peak_memory_bytes', base)} | "
            f"{med(name, 'wall_seconds'):.0f} | {med(name, 'steps'):.0f} | "
            + (f"{acc:.3f} | {margin:.4f} |" if acc is not None else " | |"))
    return "\n".join(rows)


if __name__ == "__main__":
    main()
