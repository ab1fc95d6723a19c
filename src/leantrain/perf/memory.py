"""Peak memory of a training process: resident set size (RSS) on CPU; allocator peaks on CUDA."""

from __future__ import annotations

import resource
import sys

import torch


def peak_rss_bytes() -> int:
    """Peak resident memory of this process over its whole life (getrusage; KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def device_memory(device: torch.device) -> dict[str, int]:
    """Peak allocated / reserved bytes on an accelerator (empty on CPU)."""
    if device.type == "cuda":
        return {
            "cuda_max_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "cuda_max_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
        }
    return {}
