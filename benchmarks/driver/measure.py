"""What the benchmarks measure alike: optimizer-step times and the throughput after a warm-up, the non-padding tokens
of the Trainer's batches, the process's peak memory, and the precision leantrain picks by default."""

from __future__ import annotations

import time


class StepClock:
    """Optimizer-step end times; throughput over the steps after ``warmup``; the clock pauses for evaluation."""

    def __init__(self, warmup: int):
        self.warmup, self.times, self.samples, self.tokens = warmup, [], [], []
        self.paused = 0.0

    def step(self, samples: int, tokens: int) -> None:
        self.times.append(time.perf_counter() - self.paused)
        self.samples.append(samples)
        self.tokens.append(tokens)

    def result(self) -> dict:
        w = min(self.warmup, len(self.times) - 2)
        dt = self.times[-1] - self.times[w]
        return {"steps": len(self.times), "samples_per_second": sum(self.samples[w + 1:]) / dt,
                "tokens_per_second": sum(self.tokens[w + 1:]) / dt}


class CountingCollator:
    """The Trainer's collator, noting each batch's non-padding tokens in fetch order (Accelerate's loader fetches
    one batch ahead, so the step-end callback takes them first in, first out)."""

    def __init__(self, collate):
        from collections import deque

        self.collate, self.tokens = collate, deque()

    def __call__(self, features):
        self.tokens.append(sum(sum(f["attention_mask"]) for f in features))
        return self.collate(features)


def device_type() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def peak_bytes() -> int:
    """The peak memory of this process so far: CUDA's max allocated on a GPU, else the peak RSS."""
    import torch

    from leantrain.perf.memory import peak_rss_bytes

    return torch.cuda.max_memory_allocated() if device_type() == "cuda" else peak_rss_bytes()


def default_precision() -> str:
    """The precision leantrain's ``auto`` picks on this machine's device."""
    from leantrain.engine.devices.efficiency import resolve_precision

    return resolve_precision("auto", device_type())[0]


def cpu_default_precision() -> str:
    """The precision leantrain's default config resolves to on the CPU."""
    from leantrain.config import resolve
    from leantrain.engine.devices.efficiency import resolve_precision

    return resolve_precision(resolve().efficiency.precision, "cpu")[0]
