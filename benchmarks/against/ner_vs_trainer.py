"""Token classification (NER): leantrain side by side with the Hugging Face Trainer on the same job.

    python -m benchmarks.against.ner_vs_trainer                               # 2,000 sentences, 1 epoch, 2 rounds
    python -m benchmarks.against.ner_vs_trainer --train 640 --steps 20 --repeats 2 --results benchmarks/results/tasks.md

Job: the packaged MiniLM, the first --train sentences of ../shared/data/conll2003/train.jsonl (IOB2, 9 tags), the
first --eval sentences of validation.jsonl, max_length 128, global batch 32, AdamW lr 5e-5 (weight decay 0.01,
linear schedule, no warm-up), --steps optimizer steps (default: one epoch), seed 0. Each contender runs in a fresh
process, interleaved over --repeats rounds; samples/s is taken over the optimizer steps after --warmup; medians.

Contenders:
  trainer_best  HF Trainer as its token-classification example runs, with its best switches on this CPU:
                DataCollatorForTokenClassification (dynamic padding), group_by_length, bf16 where the CPU has it;
                labels on the first sub-token of each word (-100 elsewhere)
  leantrain     leantrain's default (model.task=auto picks token-classification from tokens / ner_tags)
Entity F1: seqeval, strict IOB2 spans, over the eval sentences, the same function for both
(leantrain.methods.classify.token_classification.entity_metrics). Reuses benchmarks/driver's clock, machine
line and RESULTS.md block writer.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from benchmarks.driver.jobs import DATA
from benchmarks.driver.measure import CountingCollator, StepClock, cpu_default_precision
from benchmarks.driver.rounds import rounds_table

CONLL = DATA / "conll2003"
CONTENDERS = ["trainer_best", "leantrain"]


def job_files(workdir: Path, train_n: int, eval_n: int) -> tuple[Path, Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    out = []
    for split, n in (("train", train_n), ("validation", eval_n)):
        path = workdir / f"conll_{split}_{n}.jsonl"
        if not path.exists():
            with open(CONLL / f"{split}.jsonl") as f:
                path.write_text("".join(line for _, line in zip(range(n), f)))
        out.append(path)
    return out[0], out[1]


def tag_names(path: Path) -> list[str]:
    """leantrain's order: O first, then sorted (the Trainer gets the same ids)."""
    seen = sorted({t for line in path.read_text().splitlines() for t in json.loads(line)["ner_tags"]})
    return ["O"] + [t for t in seen if t != "O"]


def tokenized(path: Path, tokenizer, names: list[str]):
    """The Trainer example's tokenize_and_align_labels: the word's tag on its first sub-token, -100 elsewhere."""
    import datasets

    index = {n: i for i, n in enumerate(names)}
    ds = datasets.load_dataset("json", data_files=str(path), split="train")

    def encode(batch):
        enc = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=128)
        labels = []
        for i, tags in enumerate(batch["ner_tags"]):
            prev, row = None, []
            for w in enc.word_ids(i):
                row.append(-100 if w is None or w == prev else index[tags[w]])
                prev = w
            labels.append(row)
        enc["labels"] = labels
        enc["length"] = [len(ids) for ids in enc["input_ids"]]
        return enc

    return ds.map(encode, batched=True, remove_columns=ds.column_names)


def entity_f1(logits, labels, names: list[str]) -> dict:
    import numpy as np

    from leantrain.methods.classify.token_classification import entity_metrics

    preds = np.asarray(logits).argmax(-1)
    gold, pred = [], []
    for p, y in zip(preds, np.asarray(labels)):
        keep = y != -100
        gold.append([names[i] for i in y[keep]])
        pred.append([names[i] for i in p[keep]])
    return entity_metrics(gold, pred, "IOB2", names)[0]


def run_trainer(args) -> dict:
    import torch
    from transformers import (AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification,
                              Trainer, TrainerCallback, TrainingArguments)

    from leantrain.modeling import packaged_model_path

    name = packaged_model_path()
    tok = AutoTokenizer.from_pretrained(name)
    train_f, dev_f = job_files(Path(args.workdir), args.train, args.eval)
    names = tag_names(train_f)
    train, dev = tokenized(train_f, tok, names), tokenized(dev_f, tok, names)
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(
        name, num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    clock = StepClock(args.warmup)
    collate = CountingCollator(DataCollatorForTokenClassification(tok))

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            clock.step(32, collate.tokens.popleft())

    bf16 = cpu_default_precision() == "bf16"
    targs = TrainingArguments(
        output_dir=str(Path(args.workdir) / "trainer_out"), per_device_train_batch_size=32,
        per_device_eval_batch_size=64, learning_rate=5e-5, max_steps=steps_of(args), warmup_steps=0,
        lr_scheduler_type="linear", weight_decay=0.01, seed=0, use_cpu=True, report_to="none", save_strategy="no",
        logging_strategy="no", disable_tqdm=True, bf16=bf16, train_sampling_strategy="group_by_length",
        dataloader_num_workers=0)
    trainer = Trainer(model=model, args=targs, train_dataset=train, data_collator=collate, callbacks=[Clock()])
    trainer.train()
    collate.collate, collate.tokens = DataCollatorForTokenClassification(tok), __import__("collections").deque()
    out = trainer.predict(dev.remove_columns(["length"]))
    return {**clock.result(), **entity_f1(out.predictions, out.label_ids, names)}


def steps_of(args) -> int:
    return args.steps or -(-args.train // 32)


def run_leantrain(args) -> dict:
    import leantrain

    train_f, dev_f = job_files(Path(args.workdir), args.train, args.eval)
    out_dir = Path(args.workdir) / "leantrain"
    shutil.rmtree(out_dir, ignore_errors=True)  # a fresh run each round
    s = leantrain.train(None, [f"data.train={train_f}", f"data.eval={dev_f}", f"train.max_steps={steps_of(args)}",
                               "train.seed=0", "optim.warmup_steps=0", f"train.warmup_steps_excluded={args.warmup}",
                               "report.progress=none", "report.plots=false", f"output_dir={out_dir}"])
    t, ev = s["train"], s["eval"]
    return {"steps": t["steps"], "samples_per_second": t["samples_per_second"],
            "tokens_per_second": t["tokens_per_second"],
            **{k: ev[k] for k in ("entity_f1", "entity_precision", "entity_recall")}}


def table(results: dict[str, list[dict]]) -> str:
    import statistics as st

    def med(name, key):
        vals = [r[key] for r in results.get(name, []) if r.get(key) is not None]
        return st.median(vals) if vals else None

    base = med("leantrain", "samples_per_second")
    rows = ["| contender | entity F1 (median) | F1 per round | samples/s (median) | samples/s per round | tokens/s | "
            "peak RSS (GiB) | samples/s vs leantrain |", "|---|---|---|---|---|---|---|---|"]
    for name in results:
        if not results[name]:
            rows.append(f"| {name} | failed | | | | | | |")
            continue
        sps = med(name, "samples_per_second")
        f1s = ", ".join(f"{r['entity_f1']:.4f}" for r in results[name])
        rates = ", ".join(f"{r['samples_per_second']:.1f}" for r in results[name])
        rows.append(f"| {name} | {med(name, 'entity_f1'):.4f} | {f1s} | {sps:.1f} | {rates} | "
                    f"{med(name, 'tokens_per_second'):.0f} | {med(name, 'peak_rss_bytes') / 2**30:.2f} | "
                    + (f"{sps / base:.2f}x |" if base else " |"))
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", type=int, default=2000, help="training sentences (the first N of train.jsonl)")
    p.add_argument("--eval", type=int, default=1000, help="eval sentences (the first N of validation.jsonl)")
    p.add_argument("--steps", type=int, default=0, help="optimizer steps (0: one epoch)")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the throughput")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", default=",".join(CONTENDERS))
    p.add_argument("--workdir", default="/tmp/leantrain-vs-trainer-ner")
    p.add_argument("--json", default=None)
    p.add_argument("--results", default=None, metavar="RESULTS.md", help="write the table into its vs_trainer:ner block")
    p.add_argument("--from-json", default=None, help="no run: render the results saved by --json")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        from leantrain.perf.memory import peak_rss_bytes

        res = run_trainer(args) if args.worker == "trainer_best" else run_leantrain(args)
        res["peak_rss_bytes"] = peak_rss_bytes()
        print("RESULT " + json.dumps(res), flush=True)
        return
    rounds_table(__spec__.name, args, table, "ner")

if __name__ == "__main__":
    main()
