"""The chunked loss against the plain logits: peak memory and time of one forward/backward of a causal LM with a
real vocabulary, on this CPU. Each variant runs in a fresh subprocess (its RSS window starts clean), variants
interleaved over rounds, medians; ratios against plain fp32 measured in the same run.

    PYTHONPATH=src python -m benchmarks.memory.chunked_loss [--rounds 3] [--batch 16] [--seq 256] [--vocab 50257]

Model: a Llama from a config (4 layers, 256 wide, 8 heads), random weights; loss = per-token CE summed, as the
causal-LM task computes it. "peak above start": the process's peak RSS during the pass minus its RSS before it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

VARIANTS = {"plain fp32": ("false", "fp32"), "chunked fp32": ("true", "fp32"),
            "plain bf16": ("false", "bf16"), "chunked bf16": ("true", "bf16")}


def child(chunked: str, precision: str, batch: int, seq: int, vocab: int) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from leantrain.modeling.chunked_loss import apply_chunked_loss
    from leantrain.methods.lm.causal_lm import CAUSAL_LM_TASK
    from leantrain.perf import memory

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=1024,
                                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                                         max_position_embeddings=seq, tie_word_embeddings=True))
    note = apply_chunked_loss(model, chunked == "true")
    ids = torch.randint(0, vocab, (batch, seq))
    cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")

    def step():
        with cast:
            losses = CAUSAL_LM_TASK.token_losses(model, {"input_ids": ids, "labels": ids})
        losses.sum().backward()
        model.zero_grad(set_to_none=False)  # the gradients stay allocated, as in training between steps

    step()  # warm-up: gradients, runtime caches
    memory.trim_heap()
    memory.reset_peak_rss()
    start = memory.current_rss_bytes()
    t0 = time.perf_counter()
    step()
    seconds = time.perf_counter() - t0
    return {"peak_above_start": memory.window_peak_rss_bytes() - start, "seconds": seconds, "note": note}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--child", nargs=2)
    ns = ap.parse_args()
    if ns.child:
        print(json.dumps(child(*ns.child, ns.batch, ns.seq, ns.vocab)))
        return
    runs: dict[str, list[dict]] = {k: [] for k in VARIANTS}
    for r in range(ns.rounds):
        for name, (chunked, precision) in VARIANTS.items():
            out = subprocess.run([sys.executable, "-m", __spec__.name, "--child", chunked, precision,
                                  "--batch", str(ns.batch), "--seq", str(ns.seq), "--vocab", str(ns.vocab)], capture_output=True, text=True,
                                 check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("peak_above_start", "seconds")} for k, v in runs.items()}
    base = med["plain fp32"]
    print(f"{ns.batch} x {ns.seq} tokens, vocabulary {ns.vocab}, Llama 4 x 256, {ns.rounds} interleaved rounds, "
          "medians\n")
    print("| variant | peak above start MiB | vs plain fp32 | seconds fwd+bwd | vs plain fp32 |")
    print("|---|---|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v['peak_above_start'] / 2**20:.0f} | {v['peak_above_start'] / base['peak_above_start']:.2f}x"
              f" | {v['seconds']:.2f} | {v['seconds'] / base['seconds']:.2f}x |")
    print(f"\nlogits of one micro-batch in fp32: {ns.batch * ns.seq * ns.vocab * 4 / 2**20:.0f} MiB; "
          f"chunked: {runs['chunked fp32'][0]['note']}")


if __name__ == "__main__":
    main()
