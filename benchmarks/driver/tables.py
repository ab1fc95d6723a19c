"""The results side: medians and ratios over rounds, a RESULTS block (command, date, load, machine, table) written
between its markers, and the machine described in one line."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def median(results: dict[str, list[dict]], name: str, key: str) -> float | None:
    """The median of ``key`` over ``name``'s rounds (None when no round has it)."""
    import statistics

    vals = [r[key] for r in results.get(name, []) if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def ratio(results: dict[str, list[dict]], name: str, key: str, base: str) -> str:
    """``name``'s median ``key`` over ``base``'s, as ``1.23x`` ("" when either is missing)."""
    a, b = median(results, name, key), median(results, base, key)
    return f"{a / b:.2f}x" if a and b else ""


def results_block(meta: dict, text: str) -> str:
    """A RESULTS block: the command, when, the load average around the run, the machine, then ``text``."""
    load = ", ".join(f"{meta[k]:.2f} {k[5:]}" for k in ("load_before", "load_after") if meta.get(k) is not None)
    return (f"Command: `{meta['command']}` ({meta['started']}" + (f"; load average {load}" if load else "")
            + f")\n\nMachine: {meta['machine']}\n\n{text}\n")


def machine() -> str:
    """CPU model, cores, memory, bf16 support and library versions, for the results file."""
    import platform

    import accelerate
    import torch
    import transformers

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")),
                 platform.processor() or platform.machine())
    bf16 = "AVX512-BF16" if "avx512_bf16" in info else "no AVX512-BF16"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (f"{model}, {os.cpu_count()} cores ({bf16}), {mem:.0f} GiB, {gpu}; torch {torch.__version__}, "
            f"transformers {transformers.__version__}, accelerate {accelerate.__version__}")


def write_block(path: Path, key: str, block: str) -> None:
    """Replace the text between ``<!-- vs_trainer:KEY -->`` and ``<!-- /vs_trainer:KEY -->`` (appended if absent)."""
    begin, end = f"<!-- vs_trainer:{key} -->", f"<!-- /vs_trainer:{key} -->"
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + begin + "\n" + block + end + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n{begin}\n{block}{end}\n"
    path.write_text(text)
    print(f"wrote the {key} block of {path}", file=sys.stderr)
