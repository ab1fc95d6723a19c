"""Where GRPO on the built-in arithmetic prompts starts (not a test): how many of SmolLM2-135M-Instruct's SAMPLED
answers to each prompt are right before any training. GRPO learns from a group only when its answers differ (some
right, some wrong), so the built-in task (``leantrain.data.lm.arithmetic``) is chosen for many such groups.

    PYTHONPATH=src flock /tmp/leantrain-cpu.lock python -m benchmarks.convergence.grpo_start [--prompts 16] \
        [--samples 8] [--seeds 1 2]

The first ``--prompts`` training rows rendered by the prompts data side, left-padded by its collator, ``--samples``
completions each with transformers' ``generate`` (temperature 1, no top-k / top-p, 24 new tokens, as
examples/grpo-arithmetic.yaml), scored by the built-in reward ``numeric:answer``. Prints the right answers per
prompt, their mean and how many prompts are mixed (0 < right < samples), per sampling seed.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from leantrain.config import resolve
from leantrain.data.lm import arithmetic, prompts
from leantrain.data.lm.preference_render import policy_rendering
from leantrain.modeling.presets import preset_path
from leantrain.methods.grpo.rewards import combine, load_rewards, score


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    path = preset_path("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = arithmetic.build()[0][:args.prompts]
    rendering = policy_rendering(tok, "auto", textual=False)
    batch = prompts.collator(tok, resolve(None, []).data, train=True)(
        [{"prompt_input_ids": prompts.render_prompt(r["prompt"], tok, rendering), **r} for r in rows])
    rewards, k = load_rewards(["numeric:answer"]), args.samples
    for seed in args.seeds:
        torch.manual_seed(seed)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=batch["prompt_input_ids"], attention_mask=batch["prompt_attention_mask"],
                                 do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=24,
                                 num_return_sequences=k, pad_token_id=tok.pad_token_id or tok.eos_token_id)
        ids = out[:, batch["prompt_input_ids"].shape[1]:]
        texts = tok.batch_decode(ids, skip_special_tokens=True)
        answers = [a for a in batch["columns"]["answer"] for _ in range(k)]
        scores = score(rewards, [p for p in batch["prompt"] for _ in range(k)], texts, ids.tolist(),
                       {"answer": answers}, conversational=True, step=0)
        right = combine(scores, rewards).reshape(len(rows), k).sum(1).astype(int).tolist()
        mixed = sum(0 < r < k for r in right)
        print(f"seed {seed}: right of {k} per prompt {right}, mean {sum(right) / (len(rows) * k):.2f}, "
              f"mixed {mixed}/{len(rows)} ({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
