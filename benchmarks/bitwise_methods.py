"""The same short run of every method, hashed: a refactor that must not change behaviour runs this before and after
and compares. Each run trains 10 steps (tiny models built in a scratch folder, seeded data, dropout on where the
method keeps it) and records the sha256 of every ``*.safetensors`` of its saved model folder and of its
``metrics.jsonl`` numbers.

    python -m benchmarks.bitwise_methods --out before.json            # on the old tree
    python -m benchmarks.bitwise_methods --out after.json --against before.json

Not a test: the hashes hold for one machine and one build of torch (kernels differ between CPUs), so only two runs on
the same machine compare. ``--only`` picks runs by name.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from tests.helpers import (CHATML, TINY_LLAMA, TINY_VIT, alpaca_rows, grpo_args, lm_documents,
                           make_tiny_bert, make_tiny_chat_tokenizer, make_tiny_llama, ner_rows, score_rows, set_rows,
                           word_rows, write_grpo_files, write_jsonl, write_rows)

COMMON = ["train.max_steps=10", "train.batch_size=4", "train.micro_batch_size=2", "train.lr=3e-3",
          "train.log_every_steps=1", "report.plots=false", "report.progress=none", "checkpoint.every_steps=0"]


def pair_rows(n: int, seed: int) -> list[dict]:
    words = ["Hello world.", "The answer is 4.", "Eat well.", "Numbers.", "The weather is red."]
    return [{"prompt": f"What is {i % 5} + {seed}?", "chosen": words[(i + seed) % 5],
             "rejected": words[(i + seed + 1 + i % 3) % 5] + " Numbers?"} for i in range(n)]


def images(folder: Path, n: int, seed: int) -> Path:
    """An image folder of two classes of seeded 32x32 PNGs (bright and dark)."""
    import numpy as np
    from PIL import Image

    r = np.random.default_rng(seed)
    for i in range(n):
        label = ("bright", "dark")[i % 2]
        (folder / label).mkdir(parents=True, exist_ok=True)
        pixels = r.integers(128, 256, (32, 32, 3)) if label == "bright" else r.integers(0, 128, (32, 32, 3))
        Image.fromarray(pixels.astype("uint8")).save(folder / label / f"{i}.png")
    return folder


def runs(root: Path) -> dict[str, list[str]]:
    """Every method's 10-step run: name -> ``leantrain train`` overrides (output_dir added by the caller)."""
    bert = make_tiny_bert(root / "bert", dropout=0.1)
    tok = make_tiny_chat_tokenizer(root / "tok", chat_template=CHATML)
    llama = make_tiny_llama(root / "llama", tok, layers=1, hidden=16)
    grpo = write_grpo_files(root / "grpo")
    data = lambda name, rows, ext="csv": [  # noqa: E731
        f"data.train={(write_rows if ext == 'csv' else write_jsonl)(root / f'{name}-train.{ext}', rows(40, 0))}",
        f"data.eval={(write_rows if ext == 'csv' else write_jsonl)(root / f'{name}-eval.{ext}', rows(8, 1))}"]
    (root / "lm.txt").write_text("\n\n".join(lm_documents(60, 0)))
    feedback = [{"prompt": r["prompt"], "completion": r["chosen" if i % 2 else "rejected"], "label": bool(i % 2)}
                for i, r in enumerate(pair_rows(40, 1))]
    pairs = data("pairs", pair_rows, "jsonl")
    sft = [*data("sft", alpaca_rows, "jsonl"), "data.block_size=64"]
    out = {
        "classify": [f"model.name={bert}", *data("words", lambda n, s: word_rows(n, s, max_words=12))],
        "regression": [f"model.name={bert}", *data("scores", score_rows), "data.label_column=score"],
        "multilabel": [f"model.name={bert}", *data("sets", set_rows, "jsonl")],
        "tags": [f"model.name={bert}", *data("ner", ner_rows, "jsonl")],
        "lora-classify": [f"model.name={bert}", *data("words", lambda n, s: word_rows(n, s, max_words=12)),
                          "peft.method=lora", "peft.r=4"],
        "causal-lm": [*TINY_LLAMA, f"model.tokenizer={tok}", "model.task=causal-lm",
                      "model.config_overrides.attention_dropout=0.1", f"data.train={root / 'lm.txt'}",
                      "data.block_size=16", "data.eval_fraction=0.1"],
        "causal-lm-bf16": [*TINY_LLAMA, f"model.tokenizer={tok}", "model.task=causal-lm",
                           f"data.train={root / 'lm.txt'}", "data.block_size=16", "data.eval_fraction=0.1",
                           "efficiency.precision=bf16"],
        "sft": [f"model.name={llama}", *sft],
        "sft-packed-lora": [f"model.name={llama}", *sft, "data.packing=true", "peft.method=lora", "peft.r=4"],
        "dpo": [f"model.name={llama}", *pairs, "data.block_size=64"],
        "dpo-precompute-ipo": [f"model.name={llama}", *pairs, "data.block_size=64",
                               "preference.reference=precompute", "preference.loss=ipo"],
        "kto": [f"model.name={llama}", f"data.train={write_jsonl(root / 'feedback.jsonl', feedback)}",
                "data.eval_fraction=0.2", "data.block_size=64"],
        "reward-model": [f"model.name={bert}", *pairs],
        "grpo": grpo_args(grpo, root / "unused")[:-1] + ["train.max_steps=10"],
        "grpo-bf16-lora": grpo_args(grpo, root / "unused")[:-1] + ["efficiency.precision=bf16", "peft.method=lora",
                                                                   "peft.r=4", "grpo.temperature=0.7"],
        "causal-lm-chunked": [*TINY_LLAMA, f"model.tokenizer={tok}", "model.task=causal-lm",
                              f"data.train={root / 'lm.txt'}", "data.block_size=16", "data.eval_fraction=0.1",
                              "efficiency.chunked_loss=on", "efficiency.precision=fp32"],
        "dpo-chunked": [f"model.name={llama}", *pairs, "data.block_size=64", "efficiency.chunked_loss=on"],
        "grpo-chunked": grpo_args(grpo, root / "unused")[:-1] + ["efficiency.chunked_loss=on",
                                                                 "grpo.temperature=0.9"],
        "image": [*TINY_VIT, f"data.train={images(root / 'images', 24, 0)}", "data.eval_fraction=0.25"],
    }
    return {name: [*COMMON, *args] for name, args in out.items()}


def digest(run: Path) -> dict[str, str]:
    """sha256 of every safetensors file of the saved model, and of the logged numbers (times left out)."""
    found = {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted((run / "model").rglob("*.safetensors"))}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    numbers = [{k: v for k, v in r.items() if isinstance(v, (int, float)) and not _is_time(k)} for r in rows]
    found["metrics"] = hashlib.sha256(json.dumps(numbers, sort_keys=True).encode()).hexdigest()
    return found


def _is_time(key: str) -> bool:
    return any(w in key for w in ("time", "per_s", "/s", "mfu", "seconds", "elapsed", "eta", "wall", "share",
                                  "memory", "peak", "rss", "_s"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="where the hashes go (JSON)")
    p.add_argument("--against", type=Path, help="an earlier --out to compare with: exit 1 on any difference")
    p.add_argument("--only", nargs="*", help="run only these names")
    a = p.parse_args(argv)
    from leantrain.cli import main as leantrain

    hashes = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, args in runs(root).items():
            if a.only and name not in a.only:
                continue
            out = root / "runs" / name
            if leantrain(["train", *args, f"output_dir={out}"]) != 0:
                print(f"{name}: the run failed", file=sys.stderr)
                return 2
            hashes[name] = digest(out)
            print(name, json.dumps(hashes[name]), flush=True)
    a.out.write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    if a.against:
        before = json.loads(a.against.read_text())
        differ = sorted(n for n in hashes if before.get(n) != hashes[n])
        print("identical:", len(hashes) - len(differ), "differ:", differ or "none")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
