"""GRPO rollouts at the length people train on: GSM8K-style prompts (``data.lm.word_problems``, "reason step by
step") answered G times by SmolLM2-135M-Instruct up to --new tokens, each row ending at its own EOS, bf16 autocast
where the CPU runs it natively. Contenders, interleaved over --rounds, the same seeds:

  ours         ``decode.generate``: rows that ended leave the batch (``decode.COMPACT_AT``)
  ours_whole   the same engine keeping every row to the end (``COMPACT_AT`` out of reach): what the compaction saves;
               the same tokens (tests/unit/modeling/test_generation_engine.py)
  hf           transformers ``model.generate(do_sample=True, num_return_sequences=G)`` with the same EOS ids

    flock /tmp/leantrain-cpu.lock python -m benchmarks.speed.long_rollouts [--new 256] [--prompts 4] [--rounds 2]
        [--prompt-set arithmetic]

Measured: new tokens (up to and including each row's EOS) per second of the whole call, the share of rows cut at
--new (``completions/clipped_ratio``), the mean completion length. Not a test.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext

import torch

from benchmarks.driver.measure import default_precision
from leantrain.data.lm import arithmetic, word_problems
from leantrain.modeling.generation import decode
from leantrain.modeling.generation.decode import generate, pad_id, stop_ids
from leantrain.modeling.generation.sampling import Sampling
from leantrain.modeling.presets import preset_path


def prompts(tok, n: int, prompt_set: str = "word-problems"):
    rows = (word_problems if prompt_set == "word-problems" else arithmetic).build()[0][:n]
    texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    tok.padding_side = "left"
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return batch["input_ids"], batch["attention_mask"]


def ours(model, tok, ids, mask, g, new, seed, whole: bool) -> tuple[float, torch.Tensor]:
    saved = decode.COMPACT_AT
    decode.COMPACT_AT = 2.0 if whole else saved
    try:
        start = time.perf_counter()
        rollout = generate(model, ids, mask, num_generations=g, sampling=Sampling(new), eos_ids=stop_ids(model, tok),
                           pad_id=pad_id(tok), generator=torch.Generator().manual_seed(seed))
        return time.perf_counter() - start, rollout.completion_mask.sum(-1)
    finally:
        decode.COMPACT_AT = saved


def hf(model, tok, ids, mask, g, new, seed) -> tuple[float, torch.Tensor]:
    torch.manual_seed(seed)
    eos = stop_ids(model, tok)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, num_return_sequences=g,
                             max_new_tokens=new, top_k=0, top_p=1.0, temperature=1.0, eos_token_id=eos,
                             pad_token_id=pad_id(tok))
    seconds = time.perf_counter() - start
    new_ids = out[:, ids.shape[1]:]
    hit = torch.isin(new_ids, torch.tensor(eos)).long()
    return seconds, ((hit.cumsum(-1) - hit) == 0).sum(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", default="ours,ours_whole,hf")
    p.add_argument("--prompt-set", choices=["word-problems", "arithmetic"], default="word-problems",
                   help="arithmetic: short answers, most rows end long before --new (rows leaving the batch matter)")
    args = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = preset_path("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids, mask = prompts(tok, args.prompts, args.prompt_set)
    bf16 = default_precision() == "bf16"
    runs = {"ours": lambda s: ours(model, tok, ids, mask, args.generations, args.new, s, whole=False),
            "ours_whole": lambda s: ours(model, tok, ids, mask, args.generations, args.new, s, whole=True),
            "hf": lambda s: hf(model, tok, ids, mask, args.generations, args.new, s)}
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
        for r in range(args.rounds):
            for name in args.only.split(","):
                seconds, lengths = runs[name](r)
                print(json.dumps({"contender": name, "round": r, "prompt_set": args.prompt_set, "precision": "bf16" if bf16 else "fp32",
                                  "new": args.new, "rows": len(lengths), "seconds": round(seconds, 2),
                                  "new_tokens": int(lengths.sum()),
                                  "new_tokens_per_s": round(float(lengths.sum()) / seconds, 1),
                                  "mean_length": round(float(lengths.float().mean()), 1),
                                  "clipped_ratio": round(float((lengths >= args.new).float().mean()), 3)}),
                      flush=True)


if __name__ == "__main__":
    main()
