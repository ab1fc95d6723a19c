"""The new tasks (issue 14) against the HF Trainer, and what model.pooling does, on real data.

    python -m benchmarks.against.tasks_vs_trainer --rounds 2 --steps 300 --json tasks.json --results benchmarks/results/tasks.md
    python -m benchmarks.against.tasks_vs_trainer --only pooling ...   # just the pooling study
    python -m benchmarks.against.tasks_vs_trainer --only vs_trainer ... # just leantrain vs the Trainer

Jobs (the packaged MiniLM, or --model; global batch 32, lr 5e-5, linear decay, no warm-up, seed 0, --steps optimizer
steps, max_length 128):
  stsb        ../shared/data/stsb: sentence-pair regression (5,749 train / 1,500 dev), Pearson on dev
  multilabel  ../shared/data/conll2003/raw: each sentence's set of part-of-speech tags, keeping the 29 tags found in
              1%-35% of the training sentences (sparse, like the issue's 28-label set: 3.4 labels per row, 23% of rows
              have none); the first 10,000 sentences of eng.train, eng.testa (3,250) as dev; micro-F1 on dev
  sst2        a seeded 4,096-row slice of ../shared/data/sst2 (benchmarks.driver.jobs.sst2_files, as classify_vs_trainer's), dev accuracy

vs_trainer: per task, the HF Trainer with its best switches (dynamic padding, group_by_length, bf16 where the
device has it) against leantrain's defaults at the same batch and lr, interleaved rounds, medians. The Trainer
recipe's multi-label metric is micro-F1 at 0.5 (what its users get); its micro-F1 at the best threshold on dev is
shown beside it (an oracle: leantrain's tuned threshold is picked on the same dev set).
pooling: leantrain with model.pooling=pooler / reinit / cls on each task (and, for multi-label, the threshold
untuned), one run each (--parallel at a time: metrics only). The auto rows of STS-B and multi-label are the
vs_trainer leantrain runs (the defaults).
Each run is a fresh process; throughput is over the optimizer steps after --warmup.
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

from benchmarks.driver.jobs import DATA, sst2_files
from benchmarks.driver.measure import CountingCollator, StepClock, cpu_default_precision
from benchmarks.driver.tables import machine, write_block

TASKS = ("stsb", "multilabel")
POOLING_RUNS = [("sst2", "pooler"), ("sst2", "reinit"), ("sst2", "cls"), ("stsb", "pooler"), ("stsb", "cls"),
                ("multilabel", "pooler"), ("multilabel", "cls"), ("multilabel", "auto", "eval.tune_threshold=false"),
                ("multilabel", "pooler", "eval.tune_threshold=false")]
METRIC = {"stsb": "pearson", "multilabel": "f1_micro", "sst2": "accuracy"}


# ------------------------------------------------------------------------------------------------ job data


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def conll_sentences(path: Path) -> list[list[tuple[str, str]]]:
    out, cur = [], []
    for line in path.read_text().splitlines():
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if cur:
                out.append(cur)
            cur = []
            continue
        cur.append((parts[0], parts[1]))
    if cur:
        out.append(cur)
    return out


def job_files(workdir: Path, task: str) -> tuple[Path, Path]:
    import pandas as pd

    workdir.mkdir(parents=True, exist_ok=True)
    train, dev = workdir / f"{task}_train.jsonl", workdir / f"{task}_dev.jsonl"
    if train.exists() and dev.exists():
        return train, dev
    if task == "stsb":
        for split, path in (("train", train), ("dev", dev)):
            df = pd.read_csv(DATA / "stsb" / f"{split}.tsv", sep="\t", quoting=3)
            write_jsonl(path, ({"sentence1": a, "sentence2": b, "score": float(s)}
                               for a, b, s in zip(df.sentence1, df.sentence2, df.score)))
    elif task == "sst2":
        src_train, src_dev = sst2_files(workdir, 4096)
        for src, path in ((src_train, train), (src_dev, dev)):
            df = pd.read_csv(src, sep="\t", quoting=3)
            write_jsonl(path, ({"sentence": str(t), "label": int(y)} for t, y in zip(df.sentence, df.label)))
    else:
        raw = DATA / "conll2003" / "raw"
        tr = conll_sentences(raw / "eng.train")[:10000]
        counts: dict[str, int] = {}
        for s in tr:
            for tag in {p for _, p in s}:
                counts[tag] = counts.get(tag, 0) + 1
        keep = sorted(t for t, k in counts.items() if 0.01 * len(tr) <= k <= 0.35 * len(tr))
        for sents, path in ((tr, train), (conll_sentences(raw / "eng.testa"), dev)):
            write_jsonl(path, ({"text": " ".join(w for w, _ in s), "labels": sorted({p for _, p in s} & set(keep))}
                               for s in sents))
    return train, dev


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def label_names(train: Path) -> list[str]:
    return sorted({n for r in rows_of(train) for n in r["labels"]})


# -------------------------------------------------------------------------------------------- contenders


def run_trainer(args, task: str, files: tuple[Path, Path] | None = None, max_length: int = 128) -> dict:
    """The Trainer recipe on ``task``'s job (``files``: other (train, dev) JSONL files of the same shape; for
    multi-label, rows of ``text`` and a ``labels`` list), ``args.steps`` optimizer steps, texts cut at ``max_length``."""
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                              TrainerCallback, TrainingArguments)
    import datasets

    cuda = torch.cuda.is_available()
    bf16 = cuda or cpu_default_precision() == "bf16"
    tok = AutoTokenizer.from_pretrained(args.model)
    train_f, dev_f = files or job_files(Path(args.workdir), task)
    names = label_names(train_f) if task == "multilabel" else None

    def encode(path: Path):
        ds = datasets.load_dataset("json", data_files=str(path), split="train")
        if task == "stsb":
            enc = ds.map(lambda b: tok(b["sentence1"], b["sentence2"], truncation=True, max_length=max_length), batched=True)
            enc = enc.map(lambda b: {"labels": [float(s) for s in b["score"]]}, batched=True)
        else:
            enc = ds.map(lambda b: tok(b["text"], truncation=True, max_length=max_length), batched=True)
            enc = enc.map(lambda b: {"labels": [[float(n in ls) for n in names] for ls in b["labels"]]}, batched=True,
                          remove_columns=["labels"])
        keep = ["input_ids", "attention_mask", "token_type_ids", "labels"]
        enc = enc.select_columns(keep)
        return enc.add_column("length", [len(x) for x in enc["input_ids"]])

    train, dev = encode(train_f), encode(dev_f)
    dev = dev.select(range(min(len(dev), args.max_eval))) if args.max_eval else dev
    torch.manual_seed(0)
    kind = {"problem_type": "regression", "num_labels": 1} if task == "stsb" else {
        "problem_type": "multi_label_classification", "num_labels": len(names),
        "id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}
    model = AutoModelForSequenceClassification.from_pretrained(args.model, **kind)
    clock = StepClock(args.warmup)
    collate = CountingCollator(DataCollatorWithPadding(tok))

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            clock.step(32, collate.tokens.popleft())

    targs = TrainingArguments(
        output_dir=str(Path(args.workdir) / "trainer_out"), per_device_train_batch_size=32, learning_rate=5e-5,
        max_steps=args.steps, warmup_steps=0, lr_scheduler_type="linear", weight_decay=0.01, seed=0,
        use_cpu=not cuda, report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True, bf16=bf16,
        train_sampling_strategy="group_by_length", dataloader_num_workers=0)
    trainer = Trainer(model=model, args=targs, train_dataset=train, data_collator=collate, callbacks=[Clock()])
    trainer.train()
    logits, labels = predict(model, dev, DataCollatorWithPadding(tok), bf16)
    if task == "stsb":
        from scipy.stats import pearsonr

        metric = {"pearson": float(pearsonr(logits[:, 0], labels)[0])}
    else:
        metric = multilabel_metrics(logits, labels)
    return {**clock.result(), **metric}


def multilabel_metrics(logits, labels) -> dict:
    """Micro- and macro-F1 at the recipe's threshold 0.5, and at the one threshold (0.01 steps) that maximises
    micro-F1 on these rows (an oracle, as leantrain's tuned threshold is picked on the same rows)."""
    import numpy as np

    probs = 1 / (1 + np.exp(-logits))
    best = max(np.round(np.arange(0.01, 1, 0.01), 2), key=lambda t: micro_f1(probs > t, labels))
    return {"f1_micro": micro_f1(probs > 0.5, labels), "f1_macro": macro_f1(probs > 0.5, labels),
            "best_threshold": float(best), "f1_micro_best_threshold": micro_f1(probs > best, labels),
            "f1_macro_best_threshold": macro_f1(probs > best, labels),
            "rows_with_no_label": float(((probs > 0.5).sum(1) == 0).mean())}


def predict(model, dev, collate, bf16: bool):
    import numpy as np
    import torch

    device = next(model.parameters()).device
    outs, labels = [], []
    model.eval()
    cols = ["input_ids", "attention_mask", "token_type_ids"]
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        for s in range(0, len(dev), 128):
            rows = dev[s:s + 128]
            batch = collate([{k: rows[k][i] for k in cols} for i in range(len(rows["input_ids"]))])
            outs.append(model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu())
            labels += rows["labels"]
    return torch.cat(outs).numpy(), np.asarray(labels, dtype=np.float64)


def micro_f1(pred, labels) -> float:
    truth = labels > 0.5
    tp = (pred & truth).sum()
    return float(2 * tp / (pred.sum() + truth.sum())) if pred.sum() + truth.sum() else 0.0


def macro_f1(pred, labels) -> float:
    """The mean over labels of each label's F1 (0 for a label neither predicted nor present)."""
    import numpy as np

    truth = labels > 0.5
    tp, both = (pred & truth).sum(0), pred.sum(0) + truth.sum(0)
    return float(np.where(both > 0, 2 * tp / np.maximum(both, 1), 0.0).mean())


def run_leantrain(args, task: str, extra: list[str]) -> dict:
    import leantrain

    train_f, dev_f = job_files(Path(args.workdir), task)
    name = "leantrain_" + task + "_" + "_".join(e.replace("=", "-").replace(".", "-") for e in extra)
    out = Path(args.workdir) / name
    shutil.rmtree(out, ignore_errors=True)  # a fresh run each round, never a resumed one
    over = [f"model.name={args.model}", f"data.train={train_f}", f"data.eval={dev_f}", f"train.max_steps={args.steps}",
            "train.batch_size=32", "train.lr=5e-5", "train.seed=0", "optim.warmup_steps=0",
            f"train.warmup_steps_excluded={args.warmup}", "report.progress=none", "report.plots=false",
            f"output_dir={out}", *([f"data.max_eval_samples={args.max_eval}"] if args.max_eval else []),
            *({"stsb": ["model.task=text-regression", "data.label_column=score"],
               "multilabel": ["model.task=multi-label"]}.get(task, [])), *extra]
    s = leantrain.train(None, over)
    t, ev = s["train"], s["eval"]
    res = {"steps": t["steps"], "samples_per_second": t["samples_per_second"],
           "tokens_per_second": t["tokens_per_second"], METRIC[task]: ev[METRIC[task]]}
    if task == "multilabel":
        res.update(threshold=ev.get("threshold", 0.5), f1_micro_untuned=ev.get("f1_micro_untuned", ev["f1_micro"]))
    return res


def worker(args) -> None:
    kind, task, *extra = args.worker.split(":")
    res = run_trainer(args, task) if kind == "trainer" else run_leantrain(args, task, extra)
    print("RESULT " + json.dumps(res), flush=True)


# --------------------------------------------------------------------------------------------------- driver


def top_label_baseline(workdir: Path, max_eval: int | None = None) -> dict:
    """Micro-F1 on dev (its first ``max_eval`` rows) of always predicting the most frequent training label."""
    train_f, dev_f = job_files(workdir, "multilabel")
    counts: dict[str, int] = {}
    for r in rows_of(train_f):
        for n in r["labels"]:
            counts[n] = counts.get(n, 0) + 1
    top = max(counts, key=counts.get)
    dev = rows_of(dev_f)[:max_eval]
    tp = sum(top in r["labels"] for r in dev)
    positives = sum(len(r["labels"]) for r in dev)
    return {"label": top, "f1_micro": 2 * tp / (len(dev) + positives), "labels": len(counts), "dev_rows": len(dev),
            "labels_per_row": positives / len(dev)}


def run_one(args, spec: str, results: dict, env: dict, save) -> None:
    cmd = [sys.executable, "-m", __spec__.name, "--worker", spec, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--workdir", args.workdir, "--model", args.model,
           *(["--max-eval", str(args.max_eval)] if args.max_eval else [])]
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        print(f"{spec}: FAILED\n{out.stderr[-3000:]}", file=sys.stderr, flush=True)
        results.setdefault(spec, []).append({"failed": out.stderr[-500:]})
    else:
        results.setdefault(spec, []).append(json.loads(line[7:]))
        print(f"{spec} ({time.time() - t0:.0f} s): {results[spec][-1]}", file=sys.stderr, flush=True)
    save()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", default="vs_trainer,pooling")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--model", default=None, help="default: the packaged MiniLM")
    p.add_argument("--workdir", default="/tmp/leantrain-vs-trainer-tasks")
    p.add_argument("--specs", default=None, help="comma-separated runs instead of the plan, in order, e.g. "
                   "trainer:multilabel,leantrain:multilabel,leantrain:stsb:model.pooling=pooler")
    p.add_argument("--parallel", type=int, default=1, help="pooling study: runs at a time (no speeds are taken)")
    p.add_argument("--max-eval", type=int, default=None, help="evaluate on the first N dev rows (smoke runs)")
    p.add_argument("--json", default=None)
    p.add_argument("--results", default=None, metavar="RESULTS.md")
    p.add_argument("--from-json", default=None, help="no run: render the results saved by --json")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.model is None:
        from leantrain.modeling import packaged_model_path

        args.model = packaged_model_path()
    if args.worker:
        return worker(args)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        return report(saved["results"], saved["meta"], args)
    meta = {"command": f"python -m {__spec__.name} " + " ".join(sys.argv[1:]), "machine": machine(),
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "steps": args.steps,
            "baseline": top_label_baseline(Path(args.workdir), args.max_eval)}
    results: dict[str, list[dict]] = {}
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

    def save():
        if args.json:
            Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))

    if args.specs:  # these runs, in this order, once each (e.g. a short CPU session)
        for spec in args.specs.split(","):
            run_one(args, spec, results, env, save)
        return report(results, meta, args)
    tasks = args.tasks.split(",")
    pooling_runs = POOLING_RUNS[:int(os.environ.get("POOLING_RUNS", len(POOLING_RUNS)))]  # smoke runs: fewer
    if "vs_trainer" in args.only:
        for _ in range(args.rounds):
            for task in tasks:  # interleaved: Trainer, leantrain, per task, per round
                for spec in (f"trainer:{task}", f"leantrain:{task}"):
                    run_one(args, spec, results, env, save)
    if "pooling" in args.only:  # metrics only: --parallel runs at a time
        from concurrent.futures import ThreadPoolExecutor

        specs = [":".join(["leantrain", task, f"model.pooling={pooling}", *extra]) for task, pooling, *extra in pooling_runs]
        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(lambda spec: run_one(args, spec, results, env, save), specs))
    report(results, meta, args)


def report(results: dict, meta: dict, args) -> None:
    text = tables(results, meta)
    print(text)
    if args.results:
        block = f"Command: `{meta['command']}` ({meta['started']})\n\nMachine: {meta['machine']}\n\n{text}\n"
        write_block(Path(args.results), "tasks", block)


def tables(results: dict, meta: dict) -> str:
    import statistics as st

    def med(spec, key):
        vals = [r[key] for r in results.get(spec, []) if r.get(key) is not None]
        return st.median(vals) if vals else None

    def f(v, spec=".3f"):
        return "failed" if v is None else format(v, spec)

    def rounds(spec, key, fmt):
        return ", ".join(format(r[key], fmt) for r in results.get(spec, []) if key in r)

    out = [f"{meta['steps']} optimizer steps of 32 per run.", ""]
    tasks = [t for t in ("stsb", "multilabel") if f"trainer:{t}" in results]
    if tasks:
        out += ["| task | metric | HF Trainer (best switches) | leantrain | Trainer samples/s | leantrain samples/s "
                "| speed ratio |", "|---|---|---|---|---|---|---|"]
        for t in tasks:
            m = METRIC[t]
            tr, lt = f"trainer:{t}", f"leantrain:{t}"
            ts, ls = med(tr, "samples_per_second"), med(lt, "samples_per_second")
            extra = ""
            if t == "multilabel":
                extra = (f" (at its best dev threshold: {f(med(tr, 'f1_micro_best_threshold'))}; rows with no "
                         f"label at 0.5: {f(med(tr, 'rows_with_no_label'), '.0%')})")
            ratio = f"{ls / ts:.2f}x" if ls and ts else "-"
            out.append(f"| {t} | {m} | {f(med(tr, m))} [{rounds(tr, m, '.3f')}]{extra} | {f(med(lt, m))} "
                       f"[{rounds(lt, m, '.3f')}] | {f(ts, '.0f')} [{rounds(tr, 'samples_per_second', '.0f')}] | "
                       f"{f(ls, '.0f')} [{rounds(lt, 'samples_per_second', '.0f')}] | {ratio} |")
        out.append("")
    pooled = [k for k in results if "model.pooling" in k]
    if pooled:
        out += ["| task | model.pooling | other | metric | value |", "|---|---|---|---|---|"]
        auto = {t: f"leantrain:{t}" for t in ("stsb", "multilabel")}
        rows = [(k.split(":")[1], k.split(":")[2].split("=")[1], " ".join(k.split(":")[3:])) for k in pooled]
        rows += [(t, "auto (default)", "") for t in auto if auto[t] in results]
        for task, pooling, other in sorted(rows, key=lambda r: (r[0], r[1])):
            spec = auto[task] if pooling.startswith("auto (") else ":".join(
                ["leantrain", task, f"model.pooling={pooling}", *([other] if other else [])]).replace(" ", ":")
            m = METRIC[task]
            v = med(spec, m)
            note = f" (threshold {med(spec, 'threshold'):.2f})" if task == "multilabel" and med(spec, "threshold") else ""
            out.append(f"| {task} | {pooling} | {other} | {m} | {v:.3f}{note} |" if v is not None else
                       f"| {task} | {pooling} | {other} | {m} | failed |")
        out.append("")
    b = meta.get("baseline")
    if b:
        out.append(f"Multi-label set: {b['labels']} labels, {b['labels_per_row']:.2f} labels per dev row, "
                   f"{b['dev_rows']} dev rows; always predicting the top label ({b['label']!r}): micro-F1 "
                   f"{b['f1_micro']:.3f}; predicting no label: 0.000.")
    return "\n".join(out)


if __name__ == "__main__":
    main()
