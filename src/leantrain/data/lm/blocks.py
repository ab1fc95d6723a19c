"""Fixed blocks of ``data.block_size`` tokens cut from a token stream (packed across documents, as run_clm and
nanoGPT do), as a map-style, datasets-like object the loaders and the global batching read like a processed
``datasets.Dataset``: ``len``, ``ds["length"]``, ``select_columns``, ``with_format``, ``column_names``, ``ds[list]``.

Block ``b`` is tokens ``[b * block_size, (b + 1) * block_size)`` of the stream; the short tail is dropped. Rows:
``input_ids``, ``labels`` (not shifted: the model predicts ``labels[i + 1]`` from position ``i``; -100 = no
target), ``length``, ``targets`` (the ``i >= 1`` with a target: what a shifted loss counts), and with
``document_mask`` ``position_ids`` restarting at 0 at each document start inside the block, where the label is
-100 (a document's first token is not predicted from the previous document).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from leantrain.data.lm.token_shards import TokenShards

IGNORE = -100
COLUMNS = ("input_ids", "labels", "position_ids", "length", "targets")


class Blocks:
    """Blocks over token shards; ``indices`` picks (and orders) the blocks this object holds."""

    def __init__(self, shards: TokenShards, block_size: int, *, document_mask: bool = False,
                 indices: np.ndarray | None = None, columns: Sequence[str] | None = None):
        self.shards = shards
        self.block_size = int(block_size)
        self.document_mask = bool(document_mask)
        self.n_blocks = shards.n_tokens // self.block_size  # every full block of the stream
        self.indices = np.arange(self.n_blocks, dtype=np.int64) if indices is None else np.asarray(indices, np.int64)
        all_columns = [c for c in COLUMNS if c != "position_ids" or self.document_mask]
        self._columns = list(columns) if columns is not None else all_columns
        self._targets: np.ndarray | None = None

    # ------------------------------------------------------------------ what the stream gives

    @property
    def tail_tokens(self) -> int:
        """Tokens after the last full block (dropped)."""
        return self.shards.n_tokens - self.n_blocks * self.block_size

    def _all_targets(self) -> np.ndarray:
        """Targets of every block of the stream (cached): block_size - 1, less the document starts inside it."""
        if self._targets is None:
            starts = np.arange(self.n_blocks, dtype=np.int64) * self.block_size
            full = np.full(self.n_blocks, self.block_size - 1, dtype=np.int64)
            if self.document_mask and self.n_blocks:
                docs = np.asarray(self.shards.document_starts())
                inside = np.searchsorted(docs, starts + self.block_size, side="left") - \
                    np.searchsorted(docs, starts, side="right")
                full -= inside
            self._targets = full
        return self._targets

    # ------------------------------------------------------------------ datasets-like surface

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    @property
    def num_rows(self) -> int:
        return len(self)

    def _derive(self, indices: np.ndarray | None = None, columns: Sequence[str] | None = None) -> "Blocks":
        out = Blocks.__new__(Blocks)
        out.__dict__.update(self.__dict__)
        out.indices = self.indices if indices is None else np.asarray(indices, np.int64)
        out._columns = self._columns if columns is None else list(columns)
        return out

    def select_columns(self, columns: str | Sequence[str]) -> "Blocks":
        columns = [columns] if isinstance(columns, str) else list(columns)
        unknown = [c for c in columns if c not in self._columns]
        if unknown:
            raise ValueError(f"columns {unknown} not in {self._columns}")
        return self._derive(columns=columns)

    def with_format(self, type: str | None = None, **_) -> "Blocks":  # noqa: A002 - datasets' name
        if type not in (None, "python"):
            raise ValueError(f"token blocks are read as Python rows; format {type!r} is not supported")
        return self

    def select(self, indices) -> "Blocks":  # noqa: ANN001
        """Rows ``indices`` of this object (datasets' ``select``)."""
        return self._derive(indices=self.indices[np.asarray(indices, dtype=np.int64)])

    def __getitem__(self, key):  # noqa: ANN001
        if isinstance(key, str):
            return self._column(key)
        if isinstance(key, (int, np.integer)):
            batch = self._rows([int(key)])
            return {k: v[0] for k, v in batch.items()}
        if isinstance(key, slice):
            return self._rows(list(range(len(self)))[key])
        return self._rows([int(i) for i in key])

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def _column(self, name: str):  # noqa: ANN202
        if name not in self._columns:
            raise KeyError(f"no column {name!r}; columns: {', '.join(self._columns)}")
        if name == "length":
            return np.full(len(self), self.block_size, dtype=np.int64)
        if name == "targets":
            return self._all_targets()[self.indices]
        return self._rows(list(range(len(self))))[name]

    def _rows(self, rows: list[int]) -> dict[str, list]:
        n = len(self)
        for r in rows:
            if not -n <= r < n:
                raise IndexError(f"row {r} out of range for {n} blocks")
        blocks = [int(self.indices[r]) for r in rows]
        out: dict[str, list] = {c: [] for c in self._columns}
        targets = self._all_targets()
        for b in blocks:
            start = b * self.block_size
            ids = self.shards.read(start, start + self.block_size)
            row = self.block_row(ids, start)
            row["targets"] = int(targets[b])
            for c in self._columns:
                out[c].append(row[c])
        return out

    def block_row(self, ids: np.ndarray, start: int) -> dict:
        """One block's row from its tokens (starting at ``start`` in the stream)."""
        labels = ids.copy()
        row = {"input_ids": ids.tolist(), "length": len(ids)}
        if self.document_mask:
            docs = self.shards.document_starts()
            lo, hi = np.searchsorted(docs, [start + 1, start + len(ids)], side="left")
            cuts = np.asarray(docs[lo:hi], dtype=np.int64) - start  # document starts inside the block (> 0)
            labels[cuts] = IGNORE
            positions = np.arange(len(ids), dtype=np.int64)
            offsets = np.zeros(len(ids), dtype=np.int64)
            offsets[cuts] = cuts - np.concatenate([[0], cuts[:-1]])
            positions -= np.cumsum(offsets)
            row["position_ids"] = positions.tolist()
        row["labels"] = labels.tolist()
        return row

    # ------------------------------------------------------------------ splits and fingerprint

    def hold_out(self, fraction: float, seed: int) -> tuple["Blocks", "Blocks"]:
        """A seeded hold-out of blocks: (train, eval), eval = round(fraction x blocks), at least 1."""
        n = len(self)
        n_eval = min(max(1, int(round(fraction * n))), n - 1)
        perm = np.random.default_rng([seed, 15]).permutation(n)
        eval_rows, train_rows = np.sort(perm[:n_eval]), np.sort(perm[n_eval:])
        return self.select(train_rows), self.select(eval_rows)

    def data_fingerprint(self) -> str:
        """What the checkpoints compare on resume: the shards' content (their sha256s), the block size, the
        document mask and the blocks held."""
        h = hashlib.sha256()
        for entry in self.shards.manifest["shards"]:
            h.update(entry["sha256"].encode())
        h.update(f"{self.block_size}/{self.document_mask}/{len(self)}".encode())
        h.update(np.ascontiguousarray(self.indices, dtype="<i8").tobytes())
        return h.hexdigest()

    def __repr__(self) -> str:
        return (f"Blocks({len(self)} of {self.n_blocks} blocks of {self.block_size} tokens, "
                f"document_mask={self.document_mask}, columns={self._columns})")
