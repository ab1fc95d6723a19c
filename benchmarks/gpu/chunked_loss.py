"""The chunked loss on a CUDA GPU: equality with the plain loss (fp32 and bf16 autocast) on a Llama with GPT-2's
vocabulary, then peak allocated memory and time of one forward/backward, plain against chunked at several chunk sizes.

    PYTHONPATH=src python -m benchmarks.gpu.chunked_loss [--out results.json]

Needs torch, transformers and leantrain's ``modeling`` package (``chunked_loss``, ``token_losses``).
Times: CUDA events, median of 5 after 2 warm-ups. Memory: torch.cuda.max_memory_allocated above the start of the pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from leantrain.modeling import chunked_loss as CL
from leantrain.modeling.token_losses import token_losses


def llama(vocab=50257, width=256, layers=4, seq=2048):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=4 * width,
                                        num_hidden_layers=layers, num_attention_heads=width // 32,
                                        num_key_value_heads=width // 32, max_position_embeddings=seq,
                                        tie_word_embeddings=True)).cuda()


def step(model, ids, labels, bf16: bool, chunked: bool):
    """One forward (under autocast, as Accelerate wraps it) and backward: the installed loss when ``chunked``."""
    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            return model(input_ids=ids)

    assert CL.is_installed(model) == chunked
    losses = token_losses(model, forward, labels).losses
    losses.sum().backward()
    return losses.detach()


def equality(bf16: bool) -> dict:
    plain = llama()
    chunked = llama()
    chunked.load_state_dict(plain.state_dict())
    CL.install_chunked_loss(chunked, chunk_tokens=300)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50257, (4, 256), generator=g).cuda()
    labels = ids.clone()
    labels[0, :50] = -100
    labels[3, -20:] = -100
    lp = step(plain, ids, labels, bf16, False)
    lc = step(chunked, ids, labels, bf16, True)

    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()

    grads = {n: rel(dict(chunked.named_parameters())[n].grad, p.grad) for n, p in plain.named_parameters()
             if p.grad is not None}
    worst = max(grads, key=grads.get)
    return {"bf16": bf16, "loss_rel": rel(lc, lp), "worst_grad_rel": grads[worst], "worst_grad": worst,
            "embed_grad_rel": grads["model.embed_tokens.weight"]}


def measure(batch: int, seq: int, bf16: bool, chunk: int | None) -> dict:
    model = llama(seq=seq)
    if chunk:
        CL.install_chunked_loss(model, chunk_tokens=chunk)
    ids = torch.randint(0, 50257, (batch, seq), device="cuda")
    for _ in range(2):
        step(model, ids, ids, bf16, bool(chunk))
    model.zero_grad(set_to_none=False)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(model, ids, ids, bf16, bool(chunk))
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    peak = torch.cuda.max_memory_allocated() - start
    del model
    torch.cuda.empty_cache()
    return {"batch": batch, "seq": seq, "bf16": bf16, "chunk": chunk or 0, "peak_above_start_mib": peak / 2**20,
            "ms": statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ns = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "equality": [], "memory": []}
    for bf16 in (False, True):
        res["equality"].append(equality(bf16))
        print(res["equality"][-1], flush=True)
    for batch, seq in ((16, 256), (8, 2048)):
        for bf16 in (False, True):
            for chunk in (None, CL.default_chunk_tokens(50257), 1024, 4096):
                res["memory"].append(measure(batch, seq, bf16, chunk))
                print(res["memory"][-1], flush=True)
    if ns.out:
        Path(ns.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
