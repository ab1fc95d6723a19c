"""Global batches from (seed, epoch, global batch size) alone, then split across processes and micro-steps.

The same examples land in the same optimizer step whatever the number of processes or accumulation steps, so
1 process x accumulation 4 == 2 processes x accumulation 2 == 4 processes x 1. A process that would get an
empty micro-batch (a last batch smaller than processes x accumulation) gets one padding example with loss
weight 0: every rank runs the same number of forward/backward passes and nothing is counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

import numpy as np

Batching = Literal["grouped", "dynamic", "padded"]


def epoch_batches(
    lengths: Sequence[int] | np.ndarray,
    batch_size: int,
    *,
    seed: int,
    epoch: int,
    batching: Batching = "grouped",
    group_size: int = 50,
    drop_last: bool = False,
) -> list[np.ndarray]:
    """The global batches of one epoch: every index exactly once (unless drop_last), a partial batch last.

    grouped: shuffle, cut into mega-batches of ``group_size`` global batches, sort each by length (longest
    first), cut into batches and shuffle the batch order, with the longest batch first (peak memory shows at
    step 1, not hours in). dynamic / padded: a plain shuffle.
    """
    lengths = np.asarray(lengths)
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(lengths))
    if batching == "grouped":
        mega = batch_size * group_size
        chunks = [perm[s : s + mega] for s in range(0, len(perm), mega)]
        perm = np.concatenate([c[np.argsort(-lengths[c], kind="stable")] for c in chunks]) if chunks else perm
    batches = [perm[s : s + batch_size] for s in range(0, len(perm), batch_size)]
    tail = batches.pop() if batches and len(batches[-1]) < batch_size else None
    if batching == "grouped" and batches:
        order = rng.permutation(len(batches))
        batches = [batches[i] for i in order]
        longest = int(np.argmax([lengths[b].max() for b in batches]))
        batches.insert(0, batches.pop(longest))
    if tail is not None and not drop_last:
        batches.append(tail)
    return batches


def split_global_batch(batch: np.ndarray, parts: int) -> list[np.ndarray]:
    """Cut a global batch into ``parts`` contiguous micro-batches (sizes differ by at most one).

    An empty part becomes one padding index, encoded as ``-1 - index`` (loss weight 0, see ``WeightedView``).
    Contiguous parts keep length-sorted neighbours together, so grouped batching pads little per micro-batch.
    """
    out = []
    for part in np.array_split(batch, parts):
        out.append(part if len(part) else np.array([-1 - int(batch[0])]))
    return out


@dataclass
class EpochMicroBatches:
    """The batch sampler of one epoch: this rank's micro-batches, ``accum`` per optimizer step, from ``start_step`` on."""

    batches: list[np.ndarray]
    rank: int
    world_size: int
    accum: int
    start_step: int = 0

    def __len__(self) -> int:
        return (len(self.batches) - self.start_step) * self.accum

    def __iter__(self) -> Iterator[list[int]]:
        parts = self.world_size * self.accum
        for batch in self.batches[self.start_step :]:
            pieces = split_global_batch(batch, parts)
            for a in range(self.accum):
                yield pieces[a * self.world_size + self.rank].tolist()


class WeightedView:
    """Map-style dataset over a processed ``datasets.Dataset``; index ``-1 - i`` is example i with weight 0.

    ``__getitems__`` fetches a whole micro-batch from Arrow in one call (the DataLoader uses it when present).
    """

    def __init__(self, dataset, columns: list[str]):
        self.dataset = dataset.select_columns(columns).with_format(None)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: list[int]) -> list[dict]:
        real = [i if i >= 0 else -1 - i for i in indices]
        cols = self.dataset[real]
        rows = [dict(zip(cols, values)) for values in zip(*cols.values())]
        for row, i in zip(rows, indices):
            row["loss_weight"] = 0.0 if i < 0 else 1.0
        return rows

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])[0]
