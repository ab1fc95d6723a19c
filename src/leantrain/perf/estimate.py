"""Memory without compute: the first, cheap stage of ``leantrain plan``.

The actual model (LoRA adapters, chunked loss, checkpointing and autocast as the run has them) runs one training
forward/backward on *fake* tensors (``torch._subclasses.FakeTensorMode``: shapes, dtypes and devices, no data, no
arithmetic), at micro-batches of 1 and 2. Autograd's saved-for-backward storages are counted as the real calibration
counts them (``memory_model.SavedBytes``), and every tensor an operation creates is followed from its allocation to
its release, which gives the peak of live bytes above the parameters (activations, gradients and the transients of
the backward pass). Both grow linearly in the micro-batch at a fixed length, so the two passes price every
micro-batch through the same ``memory_model.Calibration`` as the measured one (``method="estimated"``, no seconds).

What it cannot see is the allocator: CPU RSS keeps freed pages (fragmentation, arenas) and CUDA's caching
allocator rounds blocks, so ``leantrain plan`` calibrates with real passes where the estimate is close to the
budget, or with ``--calibrate``. What those passes would cost is estimated too (``pass_seconds``), so that a plan
does not start minutes of passes unasked.
"""

from __future__ import annotations

import os
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from leantrain.modeling.switches import is_checkpointing, set_checkpointing
from leantrain.perf.flops import peak_flops
from leantrain.perf.memory_model import (Calibration, SavedBytes, autocast_for, calibration_batch, forward_backward,
                                         storage_key)

EFFICIENCY = 0.3  # share of the matmul probe's FLOP/s a whole forward/backward reaches (CPU, eager)


class LiveBytes(TorchDispatchMode):
    """The peak of the bytes held by storages that operations created, each counted from its creation until it is
    garbage (a weak reference's callback); views of one storage count once."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.alive: set[tuple[bool, int]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        key, storage = storage_key(t), t.untyped_storage()
        if key in self.alive:
            return
        n = storage.nbytes()
        self.alive.add(key)
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, n)

    def _free(self, key: tuple[bool, int], n: int) -> None:
        self.live -= n
        self.alive.discard(key)


def fake_pass(model, task, m: int, seq_len: int, precision: str) -> tuple[int, int]:
    """(saved-for-backward bytes, peak live bytes) of one training forward/backward at (m, seq_len) on fake
    tensors; the model's real parameters stand in as fake ones (nothing is computed, nothing changes)."""
    device = next(model.parameters()).device
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        params = list(model.parameters())  # a custom autograd Function may save the real tensor itself
        fakes = [mode.from_tensor(p) for p in params]  # held: the pass reuses them (the converter's memo is weak)
        saved, live = SavedBytes(model, params + fakes), LiveBytes()
        try:
            with live:
                forward_backward(model, task, m, seq_len, autocast_for(precision, device), saved.hooks())
        finally:
            model.zero_grad(set_to_none=True)
        del fakes
    return saved.total(), live.peak


def fake_eval_peak(model, task, rows: int, seq_len: int, precision: str) -> int:
    """Peak live bytes of one evaluation forward (``Task.evaluation.outputs``: no gradients, eval mode; the task's own
    reference model too) of ``rows`` examples of ``seq_len`` tokens, on fake tensors: what an eval batch of that width
    allocates above the weights, priced without computing it."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
            batch = calibration_batch(model, task, rows, seq_len)
            live = LiveBytes()
            with live, autocast_for(precision, device)():
                task.evaluation.outputs(model, batch)
    finally:
        model.train(was_training)
    return live.peak


def estimate(model, seq_len: int, precision: str, checkpointing: bool, *, task) -> Calibration:
    """The memory lines' calibration for one precision and checkpointing setting, from two fake passes."""
    was_training, was_ckpt = model.training, is_checkpointing(model)
    model.train()
    set_checkpointing(model, checkpointing)
    try:
        one, two = fake_pass(model, task, 1, seq_len, precision), fake_pass(model, task, 2, seq_len, precision)
    finally:
        set_checkpointing(model, was_ckpt)
        model.train(was_training)
    return Calibration(precision, checkpointing, seq_len, (1, 2), (one[0], two[0]), (one[1], two[1]), (0.0, 0.0),
                       method="estimated")


def pass_seconds(model, tokens: int, precision: str) -> float | None:
    """Rough seconds of real forward/backward passes over ``tokens`` tokens: 6 FLOPs per parameter and token (a frozen
    base still carries the gradients through) at ``EFFICIENCY`` of this device's peak, and on a CPU slowed by the
    load beyond its cores (a machine shared by others). None where no peak is known."""
    device = next(model.parameters()).device
    peak = peak_flops(device, precision)[0]
    if not peak:
        return None
    busy = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)) if device.type == "cpu" else 1.0
    return 6.0 * sum(p.numel() for p in model.parameters()) * tokens / (peak * EFFICIENCY) * busy
