"""Instruction tuning: leantrain side by side with the Hugging Face Trainer and a response-only collator.

    python benchmarks/sft_vs_trainer.py                                   # SmolLM2-135M, ../shared/data/alpaca_5k
    python benchmarks/sft_vs_trainer.py --rows 400 --steps 8 --micro-batch 4 --rounds 2 --json out.json

Job: the first --rows rows of ../shared/data/alpaca_5k/train.jsonl (CC BY-NC 4.0: read in place, benchmark use
only), the model's chat template, loss on the responses only, block 512, a full fine-tune (AdamW, lr 2e-5, bf16
autocast, fp32 weights), micro-batch = global batch = --micro-batch, --steps optimizer steps after 3 warm-up steps.
Both sides get the same rows: the Trainer's are rendered by leantrain.data.instructions (the same tokens and labels:
-100 outside the assistant's turns), so only the training differs.

Contenders, each in a fresh process (peak memory is per process), interleaved over --rounds rounds, medians:
  trainer             HF Trainer, its best switches: group_by_length, bf16, a padding collator (response-only labels)
  leantrain           leantrain's default: packed blocks of 512 (data.packing=auto), length-grouped batches
  leantrain_unpacked  leantrain, one example per row (data.packing=false): the Trainer's rows

Tokens/s counts target tokens (response tokens), the same way on both sides, over the steps after the warm-up.
Peak memory: CUDA max allocated on a GPU, else the process's peak RSS (VmHWM). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALPACA = REPO.parent / "shared" / "data" / "alpaca_5k" / "train.jsonl"
CONTENDERS = ["trainer", "leantrain", "leantrain_unpacked"]
WARMUP = 3  # leantrain's meter leaves out the first 3 steps; the Trainer's timing here does the same


def rows_file(workdir: Path, rows: int) -> Path:
    """The first ``rows`` rows, in a temporary folder outside the repository."""
    out = workdir / f"alpaca_{rows}.jsonl"
    if not out.exists():
        with open(ALPACA) as f:
            out.write_text("".join(line for _, line in zip(range(rows), f)))
    return out


def peak_bytes() -> int:
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    from leantrain.perf.memory import peak_rss_bytes

    return peak_rss_bytes()


# ------------------------------------------------------------------------------------------------ contenders


def run_trainer(args, data: Path, workdir: Path) -> dict:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

    from leantrain.data import instructions as ins
    from leantrain.modeling.names import resolve_model_name

    path = resolve_model_name(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    rows = [json.loads(line) for line in open(data)]
    ds = ins.process(datasets.Dataset.from_list(rows), tok, block_size=args.block_size).dataset
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    targets: list[int] = []

    def collate(batch):  # response-only labels (already -100 on the prompts), padded per batch
        width = max(len(r["input_ids"]) for r in batch)
        ids = torch.full((len(batch), width), pad)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            n = len(r["input_ids"])
            ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(r["input_ids"]), torch.tensor(r["labels"]), 1
        targets.append(sum(r["targets"] for r in batch))
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

        def on_train_end(self, *a, **k):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    targs = TrainingArguments(
        output_dir=str(workdir / "trainer"), per_device_train_batch_size=args.micro_batch, max_steps=WARMUP + args.steps,
        learning_rate=2e-5, bf16=True, train_sampling_strategy="group_by_length", length_column_name="length", logging_steps=10**6,
        save_strategy="no", report_to=[], dataloader_num_workers=0, remove_unused_columns=False, seed=0,
        use_cpu=not torch.cuda.is_available())
    trainer = Trainer(model=model, args=targs, train_dataset=ds, data_collator=collate, callbacks=[Clock()])
    trainer.train()
    seconds = stamps[-1] - stamps[WARMUP]
    return {"tokens_per_second": sum(targets[WARMUP:WARMUP + args.steps]) / seconds, "peak_memory_bytes": peak_bytes()}


def run_leantrain(args, data: Path, workdir: Path, packing: str) -> dict:
    out = workdir / f"leantrain_{packing}"
    cmd = [sys.executable, "-m", "leantrain.cli", "train", f"model.name={args.model}", f"data.train={data}",
           f"data.block_size={args.block_size}", f"data.packing={packing}", f"train.batch_size={args.micro_batch}",
           f"train.micro_batch_size={args.micro_batch}", f"train.max_steps={WARMUP + args.steps}", "train.lr=2e-5",
           "efficiency.precision=bf16", "train.eval_every_steps=0", "report.plots=false", "report.progress=plain",
           "checkpoint.every_steps=0", f"output_dir={out}"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if r.returncode != 0:
        raise SystemExit(f"leantrain failed:\n{r.stderr[-4000:]}")
    summary = json.loads((out / "summary.json").read_text())
    tr = summary["train"]
    peak = tr.get("cuda_max_allocated_bytes") or tr["peak_memory_bytes"]
    return {"tokens_per_second": tr["tokens_per_second"], "peak_memory_bytes": peak}


def worker(args) -> None:
    workdir = Path(args.workdir)
    data = rows_file(workdir, args.rows)
    if args.worker == "trainer":
        result = run_trainer(args, data, workdir)
    else:
        result = run_leantrain(args, data, workdir, "false" if args.worker == "leantrain_unpacked" else "auto")
    print("RESULT " + json.dumps(result))


# ------------------------------------------------------------------------------------------------ driver


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rows", type=int, default=400)
    p.add_argument("--block-size", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=8, help="measured optimizer steps (after 3 warm-up steps)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--json")
    p.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    contenders = args.contenders.split(",")
    runs: dict[str, list[dict]] = {c: [] for c in contenders}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for c in contenders:
                cmd = [sys.executable, __file__, "--worker", c, "--workdir", tmp, "--model", args.model,
                       "--rows", str(args.rows), "--block-size", str(args.block_size),
                       "--micro-batch", str(args.micro_batch), "--steps", str(args.steps)]
                r = subprocess.run(cmd, capture_output=True, text=True)
                line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
                if r.returncode != 0 or line is None:
                    raise SystemExit(f"{c} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
                runs[c].append(json.loads(line[7:]))
                print(f"round {rnd + 1} {c}: {runs[c][-1]}", flush=True)
    base = contenders[0]
    table = {}
    for c in contenders:
        tps = statistics.median(r["tokens_per_second"] for r in runs[c])
        mem = statistics.median(r["peak_memory_bytes"] for r in runs[c])
        table[c] = {"tokens_per_second": tps, "peak_memory_bytes": mem}
    for c in contenders:
        t, b = table[c], table[base]
        print(f"{c:20s} target tokens/s {t['tokens_per_second']:9.1f} ({t['tokens_per_second'] / b['tokens_per_second']:.2f}x)"
              f"  peak {t['peak_memory_bytes'] / 1e6:8.0f} MB ({t['peak_memory_bytes'] / b['peak_memory_bytes']:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs, "medians": table}, indent=2))


if __name__ == "__main__":
    main()
