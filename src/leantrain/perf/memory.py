"""Peak memory of a training process: resident set size (RSS) on CPU; allocator peaks on CUDA."""

from __future__ import annotations

import resource
import sys

import torch


_EARLIER_PEAK = 0  # the peak before the last reset_peak_rss (the memory model's calibration windows)


def peak_rss_bytes() -> int:
    """Peak resident memory of this process over its whole life. Linux: VmHWM of this process's own memory map
    (getrusage's ru_maxrss also carries the parent's peak into a child started by vfork+exec, as subprocess does);
    elsewhere getrusage (KiB on Linux, bytes on macOS)."""
    hwm = _status_kib("VmHWM") * 1024
    if not hwm:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        hwm = int(peak if sys.platform == "darwin" else peak * 1024)
    return max(hwm, _EARLIER_PEAK)


def device_memory(device: torch.device) -> dict[str, int]:
    """Peak allocated / reserved bytes on an accelerator (empty on CPU)."""
    if device.type == "cuda":
        return {
            "cuda_max_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "cuda_max_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
        }
    return {}


def current_rss_bytes() -> int:
    """Resident memory of this process now (Linux /proc; 0 where unavailable)."""
    return _status_kib("VmRSS") * 1024


def reset_peak_rss() -> bool:
    """Start a new peak-RSS window (Linux >= 4.0: clear_refs 5 resets VmHWM). The whole-life peak stays in
    ``peak_rss_bytes``. False where the window cannot be reset."""
    global _EARLIER_PEAK
    _EARLIER_PEAK = peak_rss_bytes()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def window_peak_rss_bytes() -> int:
    """Peak resident memory since the last ``reset_peak_rss`` (the whole life if never reset)."""
    return _status_kib("VmHWM") * 1024 or peak_rss_bytes()  # no window where /proc is missing: the whole life


def trim_heap() -> None:
    """Give freed heap memory back to the OS (glibc malloc_trim), so that a measurement starts from live bytes."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _status_kib(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
