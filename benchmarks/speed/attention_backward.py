"""Attention forward + backward on the CPU per shape: PyTorch's SDPA (its flash kernel) against leantrain_sdpa's
backward as matmuls in fp32 (``leantrain.modeling.short_attention``), in bf16 and fp32, with a padding mask; the
grounds of ``MAX_SCORES``.

    python -m benchmarks.speed.attention_backward [--reps 20]

Shapes (batch, heads, queries, keys): GRPO's completions on their prompts' cache and its prompts (SmolLM2-135M, 9
heads), a MiniLM-sized batch, and longer rows up to 2,048. Median of ``--reps`` runs after one warm-up; each row also
prints the largest relative difference of the output and gradients between the two.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from leantrain.modeling.short_attention import MAX_SCORES, _ShortBackward

SHAPES = [(32, 9, 16, 50), (4, 9, 34, 34), (32, 12, 64, 64), (32, 9, 64, 130), (8, 9, 128, 128), (8, 9, 256, 256),
          (8, 9, 512, 512), (2, 9, 2048, 2048)]


def timed(shape, dtype, short: bool, reps: int):
    b, h, lq, lk = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, 64, generator=g, dtype=dtype).requires_grad_() for n in (lq, lk, lk))
    mask = torch.ones(b, 1, lq, lk, dtype=torch.bool).tril(lk - lq)
    mask[0, :, :, :3] = False
    times = []
    for _ in range(reps + 1):
        q.grad = k.grad = v.grad = None
        t0 = time.perf_counter()
        out = (_ShortBackward.apply(q, k, v, mask, 64 ** -0.5) if short
               else F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        t1 = time.perf_counter()
        out.backward(torch.full_like(out, 0.01))
        times.append((t1 - t0, time.perf_counter() - t1))
    fwd, bwd = sorted(times[1:], key=sum)[reps // 2]
    return fwd, bwd, [out.detach(), q.grad, k.grad, v.grad]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; MAX_SCORES = {MAX_SCORES}")
    print("| shape (B, H, Lq, Lk) | dtype | SDPA fwd + bwd (ms) | matmul bwd fwd + bwd (ms) | bwd speed-up | max rel diff |")
    print("|---|---|---|---|---|---|")
    for shape in SHAPES:
        reps = max(3, args.reps * 64 * 64 // max(64 * 64, shape[2] * shape[3]))
        for dtype in (torch.bfloat16, torch.float32):
            f1, b1, a = timed(shape, dtype, False, reps)
            f2, b2, c = timed(shape, dtype, True, reps)
            diff = max(((x.float() - y.float()).abs().max() / y.float().abs().max()).item() for x, y in zip(c, a))
            print(f"| {shape} | {str(dtype)[6:]} | {f1 * 1e3:.1f} + {b1 * 1e3:.1f} | {f2 * 1e3:.1f} + {b2 * 1e3:.1f} | "
                  f"{b1 / b2:.2f}x | {diff:.1e} |")


if __name__ == "__main__":
    main()
