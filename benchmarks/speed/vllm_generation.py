"""grpo.generation=vllm against leantrain's own engine, in one process on this machine: the vLLM engine's build time,
the time to push the trained weights into it (what every GRPO step after an update pays), and tokens/s of the same
sampling (N prompts x G completions x T new tokens, fp32, temperature 1, no EOS: every row T tokens) through both.
Rounds alternate the two engines after a warm-up round of at most 16 new tokens; the median is reported. Run it in the vLLM environment (``make test-vllm`` builds
``.venv-vllm``), from the repository root:

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m benchmarks.speed.vllm_generation            # a tiny Llama
    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m benchmarks.speed.vllm_generation --model ~/.cache/leantrain/models/smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def tiny_llama():  # noqa: ANN201
    """2 layers, hidden 128, heads of 64 dimensions (vLLM's CPU attention refuses 16), 256 words, seed 0."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a transformers causal-LM folder (default: a tiny random Llama)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from leantrain.modeling.generation.decode import generate
    from leantrain.modeling.generation.sampling import Sampling
    from leantrain.modeling.generation.vllm_engine import Engine, VllmSettings
    from leantrain.modeling.generation.vllm_engine import generate as vllm_generate

    if args.model:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    else:
        model = tiny_llama()
    model.eval()
    ids = torch.randint(3, model.config.vocab_size, (args.prompts, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    settings = VllmSettings(max_model_len=16 + args.tokens)
    call = dict(num_generations=args.generations, sampling=Sampling(args.tokens, temperature=1.0), eos_ids=[],
                pad_id=0)

    start = time.perf_counter()
    engine = Engine.current(model, settings)
    built = time.perf_counter() - start
    pushes = []
    for _ in range(args.rounds + 1):
        with torch.no_grad():
            model.lm_head.weight.mul_(1.0)  # a new version: the next call pushes every weight
        start = time.perf_counter()
        engine.feed(model)
        pushes.append(time.perf_counter() - start)

    rates = {"vllm": [], "leantrain": []}
    warm = dict(call, sampling=Sampling(min(16, args.tokens), temperature=1.0))
    engines = {"vllm": lambda g, w: vllm_generate(model, ids, mask, **(warm if w else call), generator=g,
                                                  settings=settings),
               "leantrain": lambda g, w: generate(model, ids, mask, **(warm if w else call), generator=g)}
    for round_ in range(args.rounds + 1):  # round 0 warms up, on at most 16 new tokens
        for name, run in engines.items():
            start = time.perf_counter()
            out = run(torch.Generator().manual_seed(round_), round_ == 0)
            seconds = time.perf_counter() - start
            if round_:
                rates[name].append(int(out.completion_mask.sum()) / seconds)
    result = {"model": args.model or "tiny llama (2 x 128, head 64)", "parameters": sum(p.numel() for p in
                                                                                        model.parameters()),
              "threads": torch.get_num_threads(), "engine_build_s": round(built, 2),
              "push_s_first": round(pushes[0], 3), "push_s_median": round(statistics.median(pushes[1:]), 3),
              "work": f"{args.prompts} prompts x {args.generations} x {args.tokens} tokens",
              **{f"{k}_tokens_per_s": round(statistics.median(v), 1) for k, v in rates.items()},
              "vllm_over_leantrain": round(statistics.median(rates["vllm"]) / statistics.median(rates["leantrain"]), 2)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
