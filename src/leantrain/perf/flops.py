"""Model FLOPs per token, the device's peak FLOP/s, and MFU (model FLOPs utilisation).

    flops_per_token = 6 * N + 12 * L * h * s

N: non-embedding parameters, plus a language model's output layer when it is tied to the input embedding
(``leantrain.modeling.flop_parameters``; each weight does a multiply-add forward, 2 FLOPs, and twice that backward: 6);
L * h * s: the attention scores and the weighted sum (QK^T and AV: 2 matmuls of h x s per token and layer, 2 FLOPs
each, x3 for forward + backward = 12), s the mean non-padding sequence length of the training data (a causal LM's
block length; as in PaLM and nanoGPT the causal mask's skipped half is not subtracted). This is the
*model* FLOPs count (PaLM appendix B, nanoGPT): recomputation by gradient checkpointing and work on padding tokens
are not counted, so both show as a lower MFU, as they should.

    MFU = flops_per_token * tokens/s (non-padding, all processes) / (peak FLOP/s per device * processes)

For a causal LM (``model.task=causal-lm``) tokens/s counts target tokens, s is the block length, and the attention
term is nanoGPT's ``estimate_mfu`` (12 * n_layer * n_head * head_dim * T); a block of T tokens has T-1 targets, so
MFU is under by a factor (T-1)/T (0.2% at T=512).

Peak FLOP/s: a table of dense (no sparsity) tensor-core figures for known GPUs by precision; on CPU a short matmul
probe in the precision in use, cached per CPU model, thread count, dtype and torch version under
``$LEANTRAIN_CACHE`` (default ``~/.cache/leantrain``)/peak_flops.json.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

# Dense peak FLOP/s from the vendors' data sheets (SXM parts unless named; sources in docs/measurements.md). fp32 is
# plain fp32 (no TF32). H100/H200 SXM: 989.4 TFLOP/s dense bf16 (the data sheets' 1,979 is with 2:4 sparsity).
GPU_PEAK_FLOPS: dict[str, dict[str, float]] = {
    "B200": {"fp32": 80e12, "bf16": 2250e12, "fp16": 2250e12, "fp8": 4500e12},
    "H200": {"fp32": 67e12, "bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12},
    "H100 PCIe": {"fp32": 51e12, "bf16": 756e12, "fp16": 756e12, "fp8": 1513e12},
    "H100 NVL": {"fp32": 60e12, "bf16": 835e12, "fp16": 835e12, "fp8": 1671e12},
    "H100": {"fp32": 67e12, "bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12},
    "A100": {"fp32": 19.5e12, "bf16": 312e12, "fp16": 312e12},
    "A10G": {"fp32": 31.2e12, "bf16": 70e12, "fp16": 70e12},
    "A10": {"fp32": 31.2e12, "bf16": 125e12, "fp16": 125e12},
    "L40S": {"fp32": 91.6e12, "bf16": 362e12, "fp16": 362e12, "fp8": 733e12},
    "L4": {"fp32": 30.3e12, "bf16": 121e12, "fp16": 121e12, "fp8": 242e12},
    "RTX 4090": {"fp32": 82.6e12, "bf16": 165e12, "fp16": 165e12, "fp8": 330e12},
    "V100": {"fp32": 15.7e12, "fp16": 125e12},
    "T4": {"fp32": 8.1e12, "fp16": 65e12},
}

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def flops_per_token(model_config, non_embedding_params: int, seq_len: float) -> float:
    layers = getattr(model_config, "num_hidden_layers", 0) or 0
    hidden = getattr(model_config, "hidden_size", 0) or 0
    return 6.0 * non_embedding_params + 12.0 * layers * hidden * seq_len


def gpu_peak_flops(name: str, precision: str) -> float | None:
    for key, table in GPU_PEAK_FLOPS.items():  # most specific names first
        if key.lower() in name.lower():
            return table.get(precision)
    return None


def gpu_peak(name: str, precision: str) -> tuple[float | None, str]:
    """(dense peak FLOP/s, where it comes from) of the GPU named ``name`` (``torch.cuda.get_device_name``) in
    ``precision``; None, saying so, for a GPU or precision the table does not have (no MFU is reported then)."""
    peak = gpu_peak_flops(name, precision)
    if peak:
        return peak, f"data sheet ({name}, {precision})"
    known = any(key.lower() in name.lower() for key in GPU_PEAK_FLOPS)
    return None, (f"no {precision} peak for {name!r} in the table: no MFU" if known
                  else f"unknown GPU {name!r}: no MFU (perf/flops.py GPU_PEAK_FLOPS)")


def cache_dir() -> Path:
    return Path(os.environ.get("LEANTRAIN_CACHE") or Path.home() / ".cache" / "leantrain")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_matmul_flops(dtype: torch.dtype, n: int = 1024, seconds: float = 0.3) -> float:
    """Best FLOP/s of an n x n matmul over ~``seconds`` (a short, noisy estimate of the CPU's peak). Its operands
    come from a generator of its own: the probe runs only when peak_flops.json lacks the key, so a draw from the
    global generator would make a run's dropout depend on what the cache held (a resumed run would then differ from
    the uninterrupted one whose start probed)."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(dtype) for _ in range(2))
    best, end = 0.0, time.perf_counter() + seconds
    with torch.no_grad():
        torch.mm(a, b)  # warm-up
        while time.perf_counter() < end or best == 0.0:
            t = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * n**3 / (time.perf_counter() - t))
    return best


def cpu_peak_flops(precision: str) -> float | None:
    dtype = _DTYPES.get(precision)
    if dtype is None:
        return None
    key = f"{cpu_model()}|threads={torch.get_num_threads()}|{precision}|torch={torch.__version__}"
    path = cache_dir() / "peak_flops.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key not in cache:
        cache[key] = probe_matmul_flops(dtype)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache, indent=1))
            tmp.replace(path)  # atomic: concurrent runs never read half a file
        except OSError:
            pass
    return float(cache[key])


def peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s of one device in this precision, where the number comes from)."""
    if device.type == "cuda":
        return gpu_peak(torch.cuda.get_device_name(device), precision)
    if device.type == "cpu":
        return cpu_peak_flops(precision), f"matmul probe ({cpu_model()}, {torch.get_num_threads()} threads, {precision})"
    return None, f"no peak FLOP/s known for {device.type}"


def mfu(fpt: float, tokens_per_second: float, peak: float | None, processes: int = 1) -> float | None:
    if not peak or not tokens_per_second:
        return None
    return fpt * tokens_per_second / (peak * processes)


class MfuMeter:
    """FLOPs per token and peak FLOP/s of a run, fixed at the start; ``of(tokens/s)`` is the MFU."""

    def __init__(self, model_config, non_embedding_params: int, mean_seq_len: float, device: torch.device,
                 precision: str, processes: int):
        self.flops_per_token = flops_per_token(model_config, non_embedding_params, mean_seq_len)
        self.peak, self.source = peak_flops(device, precision)
        self.processes = processes

    def of(self, tokens_per_second: float) -> float | None:
        return mfu(self.flops_per_token, tokens_per_second, self.peak, self.processes)

    def summary(self, tokens_per_second: float) -> dict:
        return {"mfu": self.of(tokens_per_second), "peak_flops": self.peak, "peak_flops_source": self.source,
                "flops_per_token": self.flops_per_token}
