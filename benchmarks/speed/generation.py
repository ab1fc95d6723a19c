"""GRPO rollouts: ``modeling.generation.decode.generate`` (one prefill, the cache repeated G times) against
``model.generate(num_return_sequences=G, do_sample=True)`` on SmolLM2-135M-Instruct, fp32 and bf16 autocast,
interleaved, a few rounds. Every completion runs the full ``--new`` tokens (no EOS for ours, ``min_new_tokens`` for
HF), so both decode the same number of tokens.

    flock /tmp/leantrain-cpu.lock python -m benchmarks.speed.generation [--rounds 3] [--static]
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext

import torch

from leantrain.modeling.presets import preset_path
from leantrain.modeling.generation.decode import generate, prefill
from leantrain.modeling.generation.sampling import Sampling

PROMPTS = ["What is 17 + 25?", "Name a colour of the sky.", "Write a haiku about rain.",
           "Explain what a prime number is in one sentence."]


def prompts(tok):
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in PROMPTS]
    tok.padding_side = "left"
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return batch["input_ids"], batch["attention_mask"]


def ours(model, ids, mask, g, new, seed):
    """Wall seconds of the whole call, and of its prefill alone (a second, separate prefill timed the same way)."""
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    rollout = generate(model, ids, mask, num_generations=g, sampling=Sampling(new), eos_ids=[], pad_id=0,
                       generator=gen)
    total = time.perf_counter() - start
    with torch.no_grad():
        start = time.perf_counter()
        prefill(model, ids, mask)
        pre = time.perf_counter() - start
    assert rollout.completion_ids.shape == (len(ids) * g, new)
    return total, pre


def hf(model, ids, mask, g, new, seed, **extra):
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, num_return_sequences=g,
                             max_new_tokens=new, min_new_tokens=new, top_k=0, top_p=1.0, temperature=1.0, **extra)
    assert out.shape[1] - ids.shape[1] == new
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--static", action="store_true", help="also HF generate with a static cache")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = preset_path("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids, mask = prompts(tok)
    tokens = len(ids) * args.generations * args.new
    for precision in ("fp32", "bf16"):
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
        with amp:
            ours(model, ids, mask, 2, 2, 0), hf(model, ids, mask, 2, 2, 0)  # warm-up
            for r in range(args.rounds):
                total, pre = ours(model, ids, mask, args.generations, args.new, r)
                theirs = hf(model, ids, mask, args.generations, args.new, r)
                row = {"precision": precision, "round": r, "ours_tok_s": round(tokens / total, 1),
                       "hf_tok_s": round(tokens / theirs, 1), "speedup": round(theirs / total, 2),
                       "ours_s": round(total, 3), "prefill_s": round(pre, 3), "decode_s": round(total - pre, 3)}
                if args.static:
                    static = hf(model, ids, mask, args.generations, args.new, r, cache_implementation="static")
                    row["hf_static_tok_s"] = round(tokens / static, 1)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
