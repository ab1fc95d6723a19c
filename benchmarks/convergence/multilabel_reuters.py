"""Multi-label default on Reuters-21578 (ModApte, 90 labels, 7,769 train / 3,019 test; issue 26).

    python -m benchmarks.convergence.multilabel_reuters features --max-length 64 --out /tmp/reuters   # frozen encoder, once
    python -m benchmarks.convergence.multilabel_reuters probe --out /tmp/reuters --json probe.json    # heads on those, seconds
    python -m benchmarks.convergence.multilabel_reuters baseline                                      # always the top label
    python -m benchmarks.convergence.multilabel_reuters trainer --max-length 32 --epochs 1 --json t.json  # the Trainer's recipe

``features``: one forward pass of the packaged MiniLM (frozen, bf16 autocast on CPU) over both splits, keeping what
a sequence-classification head can read: the pooler's output (``model.pooling=pooler``, the old default),
``tanh(h_[CLS])`` (``model.pooling=cls``) and the mean of the last hidden states over the real tokens (what the
checkpoint was trained through; not a plain transformers head). ``probe``: the head leantrain trains, alone, on those
features at full length, as a run with the defaults drives it (AdamW, global batch 32, ``train.epochs`` 3, linear
decay after 6% warm-up, weight decay 0.01 on the weight, BCE over examples x labels, seed 0), for each head
learning rate / bias start / representation / ``train.pos_weight``; scored on the test rows at the one threshold that
maximises micro-F1 on them (``eval.tune_threshold``, leantrain's default) and at 0.5 (the Trainer recipe's).
It isolates what the head does: the fine-tuned body moves too in a real run (``leantrain train`` rows in results/multilabel-reuters.md).
``trainer``: the HF Trainer's recipe fine-tuning the whole model on all train rows, scored on all test rows
(``against.tasks_vs_trainer.run_trainer``: AutoModelForSequenceClassification with problem_type=multi_label_classification,
BCE, global batch 32, lr 5e-5, linear decay, no warm-up, seed 0, dynamic padding, group_by_length, bf16 where the
CPU has it); micro-/macro-F1 at 0.5 and at the threshold that maximises micro-F1 on the test rows.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.driver.jobs import DATA as SHARED

DATA = SHARED / "reuters21578_modapte"
REPRS = ("pooler", "cls", "mean")


def rows(split: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]


def multi_hot(split_rows: list[dict], names: list[str]) -> np.ndarray:
    index = {n: i for i, n in enumerate(names)}
    out = np.zeros((len(split_rows), len(names)), np.float32)
    for i, r in enumerate(split_rows):
        out[i, [index[n] for n in r["labels"] if n in index]] = 1
    return out


def label_names() -> list[str]:
    return sorted({n for r in rows("train") for n in r["labels"]})


def f1s(pred: np.ndarray, truth: np.ndarray) -> dict:
    tp, p, t = (pred & truth).sum(0), pred.sum(0), truth.sum(0)
    micro = 2 * tp.sum() / max(p.sum() + t.sum(), 1)
    per = np.where(p + t > 0, 2 * tp / np.maximum(p + t, 1), 0.0)
    return {"f1_micro": float(micro), "f1_macro": float(per.mean())}


def baseline() -> dict:
    """Always the most frequent training label, on the test rows."""
    names = label_names()
    ytr, yte = multi_hot(rows("train"), names), multi_hot(rows("test"), names) > 0.5
    pred = np.zeros_like(yte)
    pred[:, ytr.sum(0).argmax()] = True
    return {"label": names[int(ytr.sum(0).argmax())], **f1s(pred, yte)}


def features(args) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    from leantrain.modeling import packaged_model_path

    path = packaged_model_path()
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split in ("test", "train"):
        texts = [r["text"] for r in rows(split)]
        ids = tok(texts, truncation=True, max_length=args.max_length)["input_ids"]
        order, feats, t0 = np.argsort([len(x) for x in ids]), np.zeros((len(ids), 3, 384), np.float32), time.time()
        for s in range(0, len(ids), 64):  # similar lengths together: little padding
            idx = order[s:s + 64]
            batch = tok.pad({"input_ids": [ids[i] for i in idx]}, return_tensors="pt")
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                o = model(**batch)
            h, mask = o.last_hidden_state.float(), batch["attention_mask"].unsqueeze(-1).float()
            feats[idx, 0] = o.pooler_output.float().numpy()
            feats[idx, 1] = torch.tanh(h[:, 0]).numpy()
            feats[idx, 2] = ((h * mask).sum(1) / mask.sum(1)).numpy()
            if s % 1280 == 0:
                print(f"{split} {s}/{len(ids)} {time.time() - t0:.0f}s", flush=True)
        np.save(out / f"{split}.npy", feats)


def train_head(x, y, lr: float, prior: bool, pos_weight, epochs: float = 3, batch: int = 32, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    head = torch.nn.Linear(x.shape[1], y.shape[1])
    with torch.no_grad():
        head.weight.normal_(0, 0.02, generator=g)
        head.bias.zero_()
        if prior:
            p = (y.sum(0) + 0.5) / (len(y) + 1)
            head.bias.copy_(torch.log(p / (1 - p)))
    opt = torch.optim.AdamW([{"params": [head.weight], "weight_decay": 0.01},
                             {"params": [head.bias], "weight_decay": 0.0}], lr=lr)
    steps = int(np.ceil(len(x) / batch) * epochs)
    warm = int(np.ceil(0.06 * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / max(1, warm) if s < warm else max(0.0, (steps - s) / max(1, steps - warm)))
    pw = None if pos_weight is None else torch.as_tensor(pos_weight, dtype=torch.float32)
    step = 0
    while step < steps:
        for idx in torch.randperm(len(x), generator=g).split(batch):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(head(x[idx]), y[idx], pos_weight=pw)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            if step >= steps:
                break
    return head


def score(head, x, y) -> dict:
    import torch

    with torch.no_grad():
        probs = torch.sigmoid(head(torch.as_tensor(x))).numpy()
    truth = y > 0.5
    tuned = max(((t, f1s(probs > t, truth)) for t in np.round(np.arange(0.01, 1.0, 0.01), 2)),
                key=lambda tf: tf[1]["f1_micro"])
    return {"threshold": float(tuned[0]), **tuned[1], "at_0.5": f1s(probs > 0.5, truth),
            "distinct_top_label": int(len(np.unique(probs.argmax(1))))}


def probe(args) -> None:
    names = label_names()
    ytr, yte = multi_hot(rows("train"), names), multi_hot(rows("test"), names)
    xte = np.load(Path(args.out) / "test.npy")
    if args.test_halves:  # no train features (a loaded machine): train on a seeded half of test, score on the rest
        half = np.random.default_rng(0).permutation(len(yte))
        a, b = half[: len(half) // 2], half[len(half) // 2:]
        xtr, ytr, xte, yte = xte[a], yte[a], xte[b], yte[b]
        ytr = np.maximum(ytr, 0)
    else:
        xtr = np.load(Path(args.out) / "train.npy")
    balanced = (len(ytr) - ytr.sum(0)) / np.maximum(ytr.sum(0), 1)
    runs = [(rep, lr, prior, None) for rep in REPRS for lr in args.lrs for prior in (False, True)]
    runs += [(rep, args.lrs[-1], True, pw) for rep in ("pooler", "cls") for pw in ("balanced", 3.0)]
    results = []
    for rep, lr, prior, pw in runs:
        r = REPRS.index(rep)
        weights = balanced if pw == "balanced" else None if pw is None else np.full(len(names), pw)
        t0 = time.time()
        res = score(train_head(xtr[:, r], ytr, lr, prior, weights, epochs=args.epochs), xte[:, r], yte)
        res.update(representation=rep, head_lr=lr, bias="prior" if prior else "zero", pos_weight=pw)
        results.append(res)
        print(json.dumps(res), f"{time.time() - t0:.0f}s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"baseline": baseline(), "epochs": args.epochs, "train_rows": len(ytr),
                                               "scored_rows": len(yte), "runs": results},
                                              indent=1))


def trainer(args) -> None:
    from types import SimpleNamespace

    from benchmarks.against.tasks_vs_trainer import run_trainer

    from leantrain.modeling import packaged_model_path

    steps = int(np.ceil(len(rows("train")) / 32 * args.epochs))
    run = SimpleNamespace(model=packaged_model_path(), workdir=args.out, warmup=5, steps=steps, max_eval=None)
    t0 = time.time()
    res = run_trainer(run, "multilabel", files=(DATA / "train.jsonl", DATA / "test.jsonl"), max_length=args.max_length)
    res.update(epochs=args.epochs, max_length=args.max_length, seconds=round(time.time() - t0), baseline=baseline())
    print(json.dumps(res), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["features", "probe", "baseline", "trainer"])
    p.add_argument("--out", default="/tmp/reuters-features")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--epochs", type=float, default=3)
    p.add_argument("--lrs", type=lambda v: [float(x) for x in v.split(",")], default=[5e-5, 2e-3, 1e-2, 3e-2, 1e-1],
                   help="probe: the head learning rates to try")
    p.add_argument("--json", default=None)
    p.add_argument("--test-halves", action="store_true", help="probe: train on half of the test rows, score on the "
                   "other half (when the train features could not be computed)")
    args = p.parse_args()
    if args.what == "features":
        features(args)
    elif args.what == "probe":
        probe(args)
    elif args.what == "trainer":
        trainer(args)
    else:
        print(json.dumps(baseline()))


if __name__ == "__main__":
    main()
