"""leantrain side by side with the Hugging Face Trainer and a bare PyTorch loop, on the same job.

    python -m benchmarks.against.classify_vs_trainer                      # throughput: samples/s, tokens/s, peak RSS, MFU, ratios
    python -m benchmarks.against.classify_vs_trainer --time-to-accuracy   # wall time until dev accuracy reaches --target
    python -m benchmarks.against.classify_vs_trainer --repeats 3 --steps 100 --json out.json --results benchmarks/results/against-trainer.md

Job: the packaged MiniLM, a seeded 4,096-row slice of ../shared/data/sst2/train.tsv, max_length 128, global batch 32,
AdamW, lr 5e-5, seed 0. Every contender runs in a fresh process (peak RSS is per process), contenders interleaved
(A B C ... A B C ...) over --repeats rounds; throughput is taken over the optimizer steps after --warmup.

Contenders:
  trainer_default   HF Trainer as its text-classification example runs by default: padding to max_length, fp32
  trainer_best      HF Trainer, best switches: dynamic padding (DataCollatorWithPadding), group_by_length, bf16
  bare_loop         a minimal hand-written PyTorch loop, same batching and precision as leantrain's default
  leantrain         leantrain's default
  leantrain_as_trainer_default / leantrain_as_trainer_best / leantrain_as_bare   same settings as each of those
Tokens/s counts non-padding tokens. MFU = flops_per_token x tokens/s / peak FLOP/s (leantrain.perf.flops).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from benchmarks.driver.jobs import batch_of, sst2_files, sst2_tokenized
from benchmarks.driver.measure import CountingCollator, StepClock, cpu_default_precision
from benchmarks.driver.rounds import rounds
from benchmarks.driver.tables import results_block, write_block

CONTENDERS = ["trainer_default", "trainer_best", "bare_loop", "leantrain", "leantrain_as_trainer_default",
              "leantrain_as_trainer_best", "leantrain_as_bare"]
PLAIN_CPU = ["efficiency.dropout=torch", "efficiency.cpu_allocator=system"]  # torch's dropout, glibc's defaults
LEANTRAIN_SETTINGS = {
    "leantrain": [],
    "leantrain_as_trainer_default": ["data.batching=padded", "efficiency.precision=fp32", *PLAIN_CPU],
    "leantrain_as_trainer_best": ["data.batching=grouped", "efficiency.precision=bf16", *PLAIN_CPU],
    "leantrain_as_bare": PLAIN_CPU,  # the bare loop: leantrain's default batching and precision, torch's dropout
}


# ------------------------------------------------------------------------------------------- measurement


def eval_accuracy(model, dev, collate, precision: str) -> float:
    """The same evaluation for every contender: length-sorted batches of 128, per-batch padding."""
    import torch

    order = sorted(range(len(dev)), key=lambda i: -dev[i]["length"])
    correct = 0
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        for s in range(0, len(order), 128):
            rows = [dev[i] for i in order[s:s + 128]]
            batch = collate([{k: r[k] for k in ("input_ids", "attention_mask", "token_type_ids")} for r in rows])
            logits = model(**batch).logits
            correct += int((logits.argmax(-1) == torch.tensor([r["labels"] for r in rows])).sum())
    model.train()
    return correct / len(dev)


# -------------------------------------------------------------------------------------------- contenders


def run_trainer(args, best: bool) -> dict:
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                              TrainerCallback, TrainingArguments, default_data_collator)

    from leantrain.modeling import packaged_model_path

    name = packaged_model_path()
    tok = AutoTokenizer.from_pretrained(name)
    train_f, dev_f = sst2_files(Path(args.workdir), args.rows)
    train = sst2_tokenized(train_f, tok, padding=False if best else "max_length")
    dev = sst2_tokenized(dev_f, tok, padding=False)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=2)
    clock = StepClock(args.warmup)
    collate = CountingCollator(DataCollatorWithPadding(tok) if best else default_data_collator)
    collate_eval = DataCollatorWithPadding(tok)
    reached = {}

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            clock.step(32, collate.tokens.popleft())  # non-padding tokens of the batch this step used
            if args.time_to_accuracy and state.global_step % args.eval_every == 0:
                t0 = time.perf_counter()
                acc = eval_accuracy(kw["model"], dev, collate_eval, "bf16" if best else "fp32")
                clock.paused += time.perf_counter() - t0
                if acc >= args.target and not reached:
                    reached.update(step=state.global_step, seconds=clock.times[-1] - start[0], accuracy=acc)
                    control.should_training_stop = True

    targs = TrainingArguments(
        output_dir=str(Path(args.workdir) / "trainer_out"), per_device_train_batch_size=32, learning_rate=5e-5,
        max_steps=args.max_steps if args.time_to_accuracy else args.steps, warmup_steps=0, lr_scheduler_type="linear",
        weight_decay=0.01, seed=0, use_cpu=True, report_to="none", save_strategy="no", logging_strategy="no",
        disable_tqdm=True, bf16=best and cpu_default_precision() == "bf16",
        train_sampling_strategy="group_by_length" if best else "random", dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=train.remove_columns(["length"]) if not best else train,
                      data_collator=collate,
                      callbacks=[Clock()])
    start = [time.perf_counter()]
    trainer.train()
    return {**clock.result(), "flops_per_token": model_flops_per_token(model, train["length"]),
            **({"time_to_target": reached} if args.time_to_accuracy else {})}


def run_bare(args) -> dict:
    """A hand-written loop: leantrain's default batching (length-grouped global batches, per-batch padding) and
    precision, fused AdamW, linear schedule; no logging, no evaluation, no checkpoints."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_scheduler

    from leantrain.data.batching import epoch_batches
    from leantrain.data.text import TextCollator
    from leantrain.modeling import packaged_model_path

    name = packaged_model_path()
    tok = AutoTokenizer.from_pretrained(name)
    train_f, dev_f = sst2_files(Path(args.workdir), args.rows)
    train = sst2_tokenized(train_f, tok, padding=False).with_format(None)
    dev = sst2_tokenized(dev_f, tok, padding=False)
    precision = cpu_default_precision()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=2)
    model.train()
    steps = args.max_steps if args.time_to_accuracy else args.steps
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01, fused=True)
    sched = get_scheduler("linear", opt, num_warmup_steps=0, num_training_steps=steps)
    collate = TextCollator(tok.pad_token_id)
    lengths = np.asarray(train["length"])
    clock, step, epoch, reached, start = StepClock(args.warmup), 0, 0, {}, time.perf_counter()
    while step < steps and not reached:
        for idx in epoch_batches(lengths, 32, seed=0, epoch=epoch):
            batch = batch_of(train, idx, collate)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               token_type_ids=batch["token_type_ids"]).logits
            loss = F.cross_entropy(logits.float(), batch["labels"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            clock.step(len(idx), int(lengths[idx].sum()))
            if args.time_to_accuracy and step % args.eval_every == 0:
                t0 = time.perf_counter()
                acc = eval_accuracy(model, dev, collate, precision)
                clock.paused += time.perf_counter() - t0
                if acc >= args.target:
                    reached = {"step": step, "seconds": clock.times[-1] - start, "accuracy": acc}
                    break
            if step >= steps:
                break
        epoch += 1
    return {**clock.result(), "flops_per_token": model_flops_per_token(model, lengths.tolist()),
            **({"time_to_target": reached} if args.time_to_accuracy else {})}


def run_leantrain(args, name: str) -> dict:
    import leantrain

    train_f, dev_f = sst2_files(Path(args.workdir), args.rows)
    steps = args.max_steps if args.time_to_accuracy else args.steps
    over = [f"data.train={train_f}", f"data.eval={dev_f}", f"train.max_steps={steps}", "train.seed=0",
            "optim.warmup_steps=0", f"train.warmup_steps_excluded={args.warmup}", "report.progress=none",
            "report.plots=false", f"output_dir={Path(args.workdir) / name}", *LEANTRAIN_SETTINGS[name]]
    if args.time_to_accuracy:
        over += [f"train.eval_every_steps={args.eval_every}", f"train.stop_when=eval.accuracy>={args.target}"]
    shutil.rmtree(Path(args.workdir) / name, ignore_errors=True)  # a fresh run each round, never a resumed one
    s = leantrain.train(None, over)
    t = s["train"]
    out = {"steps": t["steps"], "samples_per_second": t["samples_per_second"],
           "tokens_per_second": t["tokens_per_second"], "mfu": t.get("mfu"), "flops_per_token": t.get("flops_per_token")}
    if args.time_to_accuracy:
        from leantrain.report.logs import read_metrics

        hits = [r for r in read_metrics(Path(args.workdir) / name / "metrics.jsonl")
                if r["type"] == "eval" and r.get("eval.accuracy", 0) >= args.target]
        if hits:
            out["time_to_target"] = {"step": hits[0]["step"], "seconds": hits[0]["loop_seconds"],
                                     "accuracy": hits[0]["eval.accuracy"]}
    return out


def worker(args) -> None:
    from leantrain.perf.memory import peak_rss_bytes

    if args.worker.startswith("trainer"):
        res = run_trainer(args, best=args.worker == "trainer_best")
    elif args.worker == "bare_loop":
        res = run_bare(args)
    else:
        res = run_leantrain(args, args.worker)
    res["peak_rss_bytes"] = peak_rss_bytes()
    if res.get("mfu") is None:
        res["mfu"] = mfu_of(res, args.worker)
    print("RESULT " + json.dumps(res), flush=True)


def model_flops_per_token(model, lengths) -> float:
    from leantrain.modeling import parameter_counts
    from leantrain.perf.flops import flops_per_token

    return flops_per_token(model.config, parameter_counts(model)["non_embedding"], sum(lengths) / len(lengths))


def mfu_of(res: dict, name: str) -> float | None:
    import torch

    from leantrain.perf.flops import peak_flops

    precision = "fp32" if name in ("trainer_default", "leantrain_as_trainer_default") else cpu_default_precision()
    peak, _ = peak_flops(torch.device("cpu"), precision)
    return res["flops_per_token"] * res["tokens_per_second"] / peak if peak else None


# --------------------------------------------------------------------------------------------------- driver


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per throughput trial")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the throughput")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", default=",".join(CONTENDERS), help="comma-separated contenders")
    p.add_argument("--time-to-accuracy", action="store_true")
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--max-steps", type=int, default=600)
    p.add_argument("--workdir", default="/tmp/leantrain-vs-trainer")
    p.add_argument("--json", default=None, help="write all results (and the command and machine) here")
    p.add_argument("--results", default=None, metavar="RESULTS.md",
                   help="write the table, the command and the machine into this file's vs_trainer block")
    p.add_argument("--block", default=None, help="name of the block in --results (default: throughput or "
                   "time_to_accuracy)")
    p.add_argument("--from-json", default=None, help="no run: render the results saved by --json")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    report(*rounds(__spec__.name, args), args)


def report(results: dict[str, list[dict]], meta: dict, args) -> None:
    tta = "--time-to-accuracy" in meta["command"]
    text = table(results, tta)
    print(text)
    if args.results:
        write_block(Path(args.results), args.block or ("time_to_accuracy" if tta else "throughput"),
                    results_block(meta, text))


def table(results: dict[str, list[dict]], tta: bool) -> str:
    import statistics as st

    def med(name, key):
        vals = [r[key] for r in results.get(name, []) if r.get(key) is not None]
        return st.median(vals) if vals else None

    base = med("leantrain", "samples_per_second")
    rows = ["| contender | samples/s (median) | per round | tokens/s | peak RSS (GiB) | MFU | samples/s vs leantrain |"
            + (" time to target (s) | steps |" if tta else ""), "|---|---|---|---|---|---|---|" + ("---|---|" if tta else "")]
    for name in results:
        sps, tps, rss, mfu = (med(name, k) for k in ("samples_per_second", "tokens_per_second", "peak_rss_bytes", "mfu"))
        if sps is None:
            rows.append(f"| {name} | failed | | | | | |")
            continue
        rounds = ", ".join(f"{r['samples_per_second']:.1f}" for r in results[name])
        line = (f"| {name} | {sps:.1f} | {rounds} | {tps:.0f} | {rss / 2**30:.2f} | {mfu:.3f} | "
                + (f"{sps / base:.2f}x |" if base else " |"))
        if tta:
            reached = [r["time_to_target"] for r in results[name] if r.get("time_to_target")]
            line += (f" {st.median(x['seconds'] for x in reached):.1f} | {st.median(x['step'] for x in reached)} |"
                     if reached else " not reached | |")
        rows.append(line)
    return "\n".join(rows)


if __name__ == "__main__":
    main()
