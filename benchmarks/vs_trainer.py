"""leantrain side by side with the Hugging Face Trainer and a bare PyTorch loop, on the same job.

    python benchmarks/vs_trainer.py                      # throughput: samples/s, tokens/s, peak RSS, MFU, ratios
    python benchmarks/vs_trainer.py --time-to-accuracy   # wall time until dev accuracy reaches --target
    python benchmarks/vs_trainer.py --repeats 3 --steps 100 --json out.json --results benchmarks/RESULTS.md

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
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SST2 = REPO.parent / "shared" / "data" / "sst2"
CONTENDERS = ["trainer_default", "trainer_best", "bare_loop", "leantrain", "leantrain_as_trainer_default",
              "leantrain_as_trainer_best", "leantrain_as_bare"]
PLAIN_CPU = ["efficiency.dropout=torch", "efficiency.cpu_allocator=system"]  # torch's dropout, glibc's defaults
LEANTRAIN_SETTINGS = {
    "leantrain": [],
    "leantrain_as_trainer_default": ["data.batching=padded", "efficiency.precision=fp32", *PLAIN_CPU],
    "leantrain_as_trainer_best": ["data.batching=grouped", "efficiency.precision=bf16", *PLAIN_CPU],
    "leantrain_as_bare": PLAIN_CPU,  # the bare loop: leantrain's default batching and precision, torch's dropout
}


# ------------------------------------------------------------------------------------------------ job data


def job_files(workdir: Path, rows: int) -> tuple[Path, Path]:
    import pandas as pd

    workdir.mkdir(parents=True, exist_ok=True)
    train = workdir / f"sst2_train_{rows}.tsv"
    if not train.exists():
        full = pd.read_csv(SST2 / "train.tsv", sep="\t", quoting=3)
        full.sample(n=rows, random_state=0).to_csv(train, sep="\t", index=False)
    return train, SST2 / "dev.tsv"


def tokenized(path: Path, tokenizer, padding: str | bool):
    import datasets

    ds = datasets.load_dataset("csv", data_files=str(path), delimiter="\t", quoting=3, split="train")
    enc = ds.map(lambda b: tokenizer(b["sentence"], truncation=True, max_length=128, padding=padding), batched=True,
                 remove_columns=["sentence"])
    enc = enc.rename_column("label", "labels")
    lengths = [sum(m) for m in enc["attention_mask"]]
    return enc.add_column("length", lengths)


COLUMNS = ["input_ids", "attention_mask", "token_type_ids", "labels"]


def batch_of(train, idx, collate) -> dict:
    """The rows ``idx`` of a tokenized split, collated (per-batch padding): a hand-written loop's data step."""
    rows = train.select_columns(COLUMNS)[idx.tolist()]
    return collate([dict(zip(rows, v)) for v in zip(*rows.values())])


def default_precision() -> str:
    from leantrain.config import resolve
    from leantrain.engine.efficiency import resolve_precision

    return resolve_precision(resolve().efficiency.precision, "cpu")[0]


# ------------------------------------------------------------------------------------------- measurement


class StepClock:
    """Optimizer-step end times; throughput over the steps after ``warmup``; the clock pauses for evaluation."""

    def __init__(self, warmup: int):
        self.warmup, self.times, self.samples, self.tokens = warmup, [], [], []
        self.paused = 0.0

    def step(self, samples: int, tokens: int) -> None:
        self.times.append(time.perf_counter() - self.paused)
        self.samples.append(samples)
        self.tokens.append(tokens)

    def result(self) -> dict:
        w = min(self.warmup, len(self.times) - 2)
        dt = self.times[-1] - self.times[w]
        return {"steps": len(self.times), "samples_per_second": sum(self.samples[w + 1:]) / dt,
                "tokens_per_second": sum(self.tokens[w + 1:]) / dt}


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


class CountingCollator:
    """The Trainer's collator, noting each batch's non-padding tokens in fetch order (Accelerate's loader fetches
    one batch ahead, so the step-end callback takes them first in, first out)."""

    def __init__(self, collate):
        from collections import deque

        self.collate, self.tokens = collate, deque()

    def __call__(self, features):
        self.tokens.append(sum(sum(f["attention_mask"]) for f in features))
        return self.collate(features)


def run_trainer(args, best: bool) -> dict:
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                              TrainerCallback, TrainingArguments, default_data_collator)

    from leantrain.modeling import packaged_model_path

    name = packaged_model_path()
    tok = AutoTokenizer.from_pretrained(name)
    train_f, dev_f = job_files(Path(args.workdir), args.rows)
    train = tokenized(train_f, tok, padding=False if best else "max_length")
    dev = tokenized(dev_f, tok, padding=False)
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
        disable_tqdm=True, bf16=best and default_precision() == "bf16",
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
    train_f, dev_f = job_files(Path(args.workdir), args.rows)
    train = tokenized(train_f, tok, padding=False).with_format(None)
    dev = tokenized(dev_f, tok, padding=False)
    precision = default_precision()
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

    train_f, dev_f = job_files(Path(args.workdir), args.rows)
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

    precision = "fp32" if name in ("trainer_default", "leantrain_as_trainer_default") else default_precision()
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
    report(*rounds(__file__, args), args)


def interleaved(script: str, names: list[str], repeats: int, json_path: str | None = None
                ) -> tuple[dict[str, list[dict]], dict]:
    """Run ``script --worker NAME <this command's arguments>`` for each name, interleaved (A B C ... A B C ...) over
    ``repeats`` rounds, each in a fresh process (its round, from 0, in ``$BENCH_ROUND``); a worker prints its result
    as one ``RESULT {json}`` line. Returns
    the results per name (a failed run is left out and its error printed) and the run's meta (command, machine,
    start, load average before and after); ``json_path``: both saved there."""
    meta = {"command": f"python benchmarks/{Path(script).name} " + " ".join(sys.argv[1:]), "machine": machine(),
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": os.getloadavg()[0]}
    results: dict[str, list[dict]] = {n: [] for n in names}
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for r in range(repeats):
        for name in names:
            cmd = [sys.executable, script, "--worker", name] + [a for a in sys.argv[1:] if a != "--worker"]
            out = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, BENCH_ROUND=str(r)))
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"{name}: FAILED\n{out.stderr[-3000:]}", file=sys.stderr)
                continue
            results[name].append(json.loads(line[7:]))
            print(f"round {r + 1} {name}: {results[name][-1]}", file=sys.stderr, flush=True)
    meta["load_after"] = os.getloadavg()[0]
    if json_path:
        Path(json_path).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return results, meta


def rounds(script: str, args) -> tuple[dict[str, list[dict]], dict]:
    """``--from-json``: the results and meta a run saved with ``--json``; else new ``interleaved`` rounds of
    ``args.only`` (comma-separated) x ``args.repeats``."""
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        return saved["results"], saved["meta"]
    return interleaved(script, args.only.split(","), args.repeats, args.json)


def rounds_table(script: str, args, table, key: str) -> None:
    """``rounds``, printed as ``table(results)``; with ``--results``, also written into that file's ``key`` block."""
    results, meta = rounds(script, args)
    text = table(results)
    print(text)
    if args.results:
        write_block(Path(args.results), key, results_block(meta, text))


def driver_arguments(p: argparse.ArgumentParser, contenders: list[str], workdir: str, block: str,
                     eval_help: str) -> None:
    """The arguments of a script whose workers train then evaluate once (sft_vs_trainer.py, dpo_vs_trl.py):
    --repeats, --only, --no-eval, --workdir, --json, --results (its ``block``), --from-json, --worker (hidden)."""
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds")
    p.add_argument("--only", default=",".join(contenders), help="comma-separated contenders")
    p.add_argument("--no-eval", dest="eval", action="store_false", help=eval_help)
    p.add_argument("--workdir", default=workdir)
    p.add_argument("--json", default=None)
    p.add_argument("--results", default=None, metavar="RESULTS.md", help=f"write the table into its {block} block")
    p.add_argument("--from-json", default=None, help="no run: render the results saved by --json")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def worker_folder(args) -> Path:
    """The worker's fresh folder (``--workdir``/NAME; a fresh run each round). Sets ``args.eval_now``: its held-out
    evaluation runs in the first round only (training is seeded, so the rounds train the same model); call
    :func:`evaluated` once it has run."""
    out = Path(args.workdir) / args.worker
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    args.eval_now = args.eval and not (Path(args.workdir) / f"{args.worker}.evaluated").exists()
    return out


def evaluated(args) -> None:
    """Mark the worker's held-out evaluation done (the next rounds skip it)."""
    (Path(args.workdir) / f"{args.worker}.evaluated").touch()


def fresh_rounds(script: str, args, table, key: str) -> None:
    """The driver of such a script: ``rounds_table`` in a fresh ``--workdir`` (no eval marks left from an earlier
    run; kept with --from-json, which runs nothing)."""
    if not args.from_json:
        shutil.rmtree(args.workdir, ignore_errors=True)
    rounds_table(script, args, table, key)


def median(results: dict[str, list[dict]], name: str, key: str) -> float | None:
    """The median of ``key`` over ``name``'s rounds (None when no round has it)."""
    import statistics

    vals = [r[key] for r in results.get(name, []) if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def ratio(results: dict[str, list[dict]], name: str, key: str, base: str) -> str:
    """``name``'s median ``key`` over ``base``'s, as ``1.23x`` ("" when either is missing)."""
    a, b = median(results, name, key), median(results, base, key)
    return f"{a / b:.2f}x" if a and b else ""


def results_block(meta: dict, text: str) -> str:
    """A RESULTS.md block: the command, when, the load average around the run, the machine, then ``text``."""
    load = ", ".join(f"{meta[k]:.2f} {k[5:]}" for k in ("load_before", "load_after") if meta.get(k) is not None)
    return (f"Command: `{meta['command']}` ({meta['started']}" + (f"; load average {load}" if load else "")
            + f")\n\nMachine: {meta['machine']}\n\n{text}\n")


def report(results: dict[str, list[dict]], meta: dict, args) -> None:
    tta = "--time-to-accuracy" in meta["command"]
    text = table(results, tta)
    print(text)
    if args.results:
        write_block(Path(args.results), args.block or ("time_to_accuracy" if tta else "throughput"),
                    results_block(meta, text))


def machine() -> str:
    """CPU model, cores, memory, bf16 support and library versions, for the results file."""
    import platform

    import accelerate
    import torch
    import transformers

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")),
                 platform.processor() or platform.machine())
    bf16 = "AVX512-BF16" if "avx512_bf16" in info else "no AVX512-BF16"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (f"{model}, {os.cpu_count()} cores ({bf16}), {mem:.0f} GiB, {gpu}; torch {torch.__version__}, "
            f"transformers {transformers.__version__}, accelerate {accelerate.__version__}")


def write_block(path: Path, key: str, block: str) -> None:
    """Replace the text between ``<!-- vs_trainer:KEY -->`` and ``<!-- /vs_trainer:KEY -->`` (appended if absent)."""
    begin, end = f"<!-- vs_trainer:{key} -->", f"<!-- /vs_trainer:{key} -->"
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + begin + "\n" + block + end + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n{begin}\n{block}{end}\n"
    path.write_text(text)
    print(f"wrote the {key} block of {path}", file=sys.stderr)


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
