"""Optimizer state, measured: the bytes the optimizer actually holds, whatever their dtype.

Sum of ``numel x element_size`` over every tensor in ``optimizer.state`` (moments, step counters, 8-bit codes
and their quantisation scales and maps). A tensor shared by several parameters (bitsandbytes' quantisation map)
counts once. Reads tensor metadata only: no device sync.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors_in(v)


def _unwrap(optimizer):
    while hasattr(optimizer, "optimizer") and not hasattr(optimizer, "optimizers"):  # Accelerate's wrapper
        optimizer = optimizer.optimizer
    return optimizer


def state_tensors(optimizer) -> Iterator[torch.Tensor]:
    """Every tensor of the optimizer's state (under Accelerate's wrapper too); a shared tensor may come twice."""
    for per_param in _unwrap(optimizer).state.values():
        yield from _tensors_in(per_param)


def state_bytes(optimizer) -> int:
    """Bytes of optimizer state now held (call after the first step: most optimizers allocate lazily)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in state_tensors(optimizer):
        n = t.numel() * t.element_size()
        key = (t.data_ptr(), n)
        if n and key not in seen:
            seen.add(key)
            total += n
    return total


def trainable_parameters(optimizer) -> int:
    return sum(p.numel() for g in _unwrap(optimizer).param_groups for p in g["params"])


def state_report(optimizer, name: str) -> dict[str, Any]:
    """``{name, class, state_bytes, state_bytes_per_param, parameters}`` for summary.json's ``optim`` section."""
    opt = _unwrap(optimizer)
    nbytes, params = state_bytes(opt), trainable_parameters(opt)
    return {"name": name, "class": repr(opt) if hasattr(opt, "optimizers") else type(opt).__name__,
            "state_bytes": nbytes, "state_bytes_per_param": round(nbytes / max(params, 1), 4), "parameters": params}


def describe(report: dict[str, Any]) -> str:
    """The log line at the start of a run, e.g. ``optimizer adamw (AdamW): state 181.3 MB, 8.00 B/param``."""
    return (f"optimizer {report['name']} ({report['class']}): state {report['state_bytes'] / 1e6:.1f} MB, "
            f"{report['state_bytes_per_param']:.2f} bytes/parameter over {report['parameters'] / 1e6:.2f}M parameters")
