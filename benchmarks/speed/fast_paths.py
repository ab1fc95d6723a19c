"""What each of the CPU step's fast paths buys, measured in one process, step by step.

    python -m benchmarks.speed.fast_paths                 # 150 batches, every variant on each batch
    python -m benchmarks.speed.fast_paths --steps 300

The classify_vs_trainer job (packaged MiniLM, the seeded 4,096-row SST-2 slice, leantrain's length-grouped global batches of
32, bf16 autocast, fused AdamW, clip at 1.0). Every batch is trained once per variant, variants in turn, so all of
them see the same batches and the same machine state: between processes this machine's speed drifts by +-10%,
which would hide a 3% effect. Variants switch the fast paths in place: the dropout modules (torch's / FastDropout),
the clip (clip_grad_norm_ / folded into the fused kernel), glibc's allocator settings (defaults / reuse).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from benchmarks.driver.jobs import COLUMNS, batch_of, sst2_files, sst2_tokenized

VARIANTS = {  # name: (fast dropout, folded clip, host memory reuse)
    "plain": (False, False, False),
    "dropout": (True, False, False),
    "clip": (False, True, False),
    "host memory": (False, False, True),
    "all (leantrain default)": (True, True, True),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150, help="batches; each is trained once per variant")
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()

    from accelerate import Accelerator
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from leantrain.data.batching import epoch_batches
    from leantrain.data.text import TextCollator
    from leantrain.engine.devices import host_allocator
    from leantrain.engine.devices.distributed import clip_gradients
    from leantrain.engine.devices.dropout import FastDropout
    from leantrain.modeling import packaged_model_path

    name = packaged_model_path()
    tok = AutoTokenizer.from_pretrained(name)
    train_f, _ = sst2_files(Path("/tmp/leantrain-vs-trainer"), 4096)
    train = sst2_tokenized(train_f, tok, padding=False).with_format(None)
    lengths = np.asarray(train["length"])
    collate = TextCollator(tok.pad_token_id)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=2).train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01, fused=True)
    accelerator = Accelerator(cpu=True)
    slots = [(parent, key, child) for parent in model.modules() for key, child in parent.named_children()
             if type(child) is nn.Dropout]
    fast = [FastDropout(child.p) for _, _, child in slots]
    libc = host_allocator.tunable_glibc()

    def switch(fast_dropout: bool, reuse: bool) -> None:
        for (parent, key, child), f in zip(slots, fast):
            setattr(parent, key, f if fast_dropout else child)
        if libc is not None:
            host_allocator.set_malloc_params(libc, host_allocator.REUSE if reuse else host_allocator.GLIBC_DEFAULTS)

    batches = [b for e in range(4) for b in epoch_batches(lengths, 32, seed=0, epoch=e)][: args.steps]
    seconds = {v: 0.0 for v in VARIANTS}
    samples = {v: 0 for v in VARIANTS}
    for i, idx in enumerate(batches):
        batch = batch_of(train, idx, collate)
        for variant, (fast_dropout, folded, reuse) in VARIANTS.items():
            switch(fast_dropout, reuse)
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(**{k: batch[k] for k in COLUMNS[:3]}).logits
            nn.functional.cross_entropy(logits.float(), batch["labels"]).backward()
            if folded:
                clip_gradients(model, accelerator, 1.0, opt)
            else:
                opt.grad_scale = None
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i >= args.warmup:
                seconds[variant] += time.perf_counter() - t0
                samples[variant] += len(idx)
    switch(False, False)
    base = samples["plain"] / seconds["plain"]
    print(f"{len(batches) - args.warmup} batches per variant, after {args.warmup} warm-up batches")
    print("| variant | samples/s | vs plain |\n|---|---|---|")
    for v in VARIANTS:
        sps = samples[v] / seconds[v]
        print(f"| {v} | {sps:.1f} | {sps / base:.3f}x |")


if __name__ == "__main__":
    main()
