"""A KV cache for decoding: room reserved once for every position, written in place, in the dtype attention reads.

transformers' ``DynamicLayer`` grows by concatenation: every decoded token copies the whole cache of every layer
(``torch.cat`` of the keys and of the values), so decoding C tokens after a P-token prompt copies the cache C times.
Under a CPU autocast the keys also stay in fp32 (the rotary embedding multiplies the bf16 projections by fp32 cos /
sin) and SDPA casts the whole key cache to bf16 again at every token. ``reserve`` turns the layers of a filled
``DynamicCache`` into ``ReservedLayer``s: a buffer of ``capacity`` positions per layer, the prompt's keys and values
copied in (each row repeated ``repeats`` times: the G samples of a prompt share its prefill), each new token written
at its place; attention reads a view of the filled positions. Keys and values are both stored in the dtype attention
computes them in: the values' (the projections' matmul dtype; ``short_attention.compute_dtype`` where an autocast is
open here). Under an autocast, whether open around the caller or only around the model's forward (Accelerate's mixed
precision wraps ``forward``), the keys the rotary embedding left in fp32 are stored in it too: what SDPA and eager
attention's matmuls cast them to, so attention sees the same values bit for bit.

Only plain ``DynamicLayer``s are reserved; a cache with any other layer (sliding window, quantized, linear attention)
is repeated with ``batch_repeat_interleave`` and left as it is.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from leantrain.modeling.short_attention import compute_dtype


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of buffers reserved for ``capacity`` positions, both in the
    dtype attention computes them in (module docstring)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, repeats: int, capacity: int):
        super().__init__()
        self.device, self.is_initialized = keys.device, True
        dtype = compute_dtype(values)
        self._buffers = tuple(self._reserve(t, repeats, capacity, dtype) for t in (keys, values))
        self._view(keys.shape[-2])

    @classmethod
    def of_buffers(cls, keys: torch.Tensor, values: torch.Tensor, length: int) -> "ReservedLayer":
        """A layer over buffers already made (rows, heads, capacity, dim), their first ``length`` positions filled."""
        layer = cls.__new__(cls)
        DynamicLayer.__init__(layer)
        layer.device, layer.is_initialized, layer._buffers = keys.device, True, (keys, values)
        layer._view(length)
        return layer

    @staticmethod
    def _reserve(t: torch.Tensor, repeats: int, capacity: int, dtype: torch.dtype) -> torch.Tensor:
        b, h, n, d = t.shape
        buffer = t.new_empty((b * repeats, h, capacity, d), dtype=dtype)
        buffer.view(b, repeats, h, capacity, d)[:, :, :, :n].copy_(t[:, None])  # row i*G + j is prompt i's
        return buffer

    def _view(self, length: int) -> None:
        self.keys, self.values = (b[:, :, :length] for b in self._buffers)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"the reserved KV cache holds {self.capacity} positions; {end} asked")
        for buffer, new in zip(self._buffers, (key_states, value_states)):
            buffer[:, :, start:end].copy_(new)
        self._view(end)
        return self.keys, self.values

    @property
    def capacity(self) -> int:
        """The positions reserved."""
        return self._buffers[0].shape[2]

    def keep(self, rows: torch.Tensor) -> None:
        """Only the cache rows ``rows`` (indices) kept, in that order: a copy of their filled positions' buffers."""
        self._buffers = tuple(b.index_select(0, rows) for b in self._buffers)
        self._view(self.keys.shape[-2])

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a reserved layer is repeated when it is made (reserve's repeats)")


def reserve(cache, repeats: int, capacity: int):
    """``cache`` (a filled ``DynamicCache``) with each row repeated ``repeats`` times and room for ``capacity``
    positions in all, in the dtype attention reads, in place; returns it (module docstring)."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        cache.batch_repeat_interleave(repeats)
        return cache
    for i, layer in enumerate(layers):
        layers[i] = ReservedLayer(layer.keys, layer.values, repeats, capacity)
    return cache


def compactable(cache) -> bool:
    """Whether rows can be dropped from ``cache`` as they end (``keep_rows``): every layer is reserved."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is ReservedLayer for layer in layers)


def keep_rows(cache, rows: torch.Tensor) -> None:
    """Only the rows ``rows`` of a ``compactable`` cache kept, in place."""
    for layer in cache.layers:
        layer.keep(rows)


def gathered(cache, pieces: list, rows: int, length: int, capacity: int) -> None:
    """``cache``'s layers made anew, in place, as reserved layers of ``rows`` rows with room for ``capacity``
    positions, the first ``length`` filled from ``pieces``: each ``(to, taken, layers)``, the rows ``to`` of the new
    cache filled from the rows ``taken`` of ``layers`` (per layer the keys and values of rows set aside: (r, heads,
    positions, dim)). A piece's positions past ``length`` are left out; a row's positions past its piece's are zeros
    (attention masks them: zeros, not whatever memory held, so a masked position cannot bring a NaN in). Layer by
    layer, each piece's entry of a layer let go once copied (the lists are emptied as they are read): the old cache
    and the new are held together one layer at a time, not whole."""
    for i in range(len(cache.layers)):
        keys, values = pieces[0][2][i]
        buffers = tuple(t.new_zeros((rows, t.shape[1], capacity, t.shape[3])) for t in (keys, values))
        for to, taken, layers in pieces:
            for buffer, part in zip(buffers, layers[i]):
                n = min(part.shape[2], length)
                buffer[:, :, :n].index_copy_(0, to, part.index_select(0, taken)[:, :, :n])
            layers[i] = None
        keys = values = None
        cache.layers[i] = ReservedLayer.of_buffers(*buffers, length)
