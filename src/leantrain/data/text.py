"""Text inputs: tokenise with the model's AutoTokenizer (datasets.map, cached by fingerprint: ``data.mapped``), pad per
batch."""

from __future__ import annotations

from typing import Any

import torch

from leantrain.data.mapped import tokenizer_map

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def pad_multiple(device_type: str) -> int | None:
    """What the collators round a batch's sequence length up to: a multiple of 8 on CUDA (tensor-core tiles), else
    None: one of a few widths per octave (``padded_width``)."""
    return 8 if device_type == "cuda" else None


def padded_width(width: int, multiple_of: int | None = None) -> int:
    """``width`` rounded up to ``multiple_of``; without one, to one of at most four widths an octave (a multiple of
    2^(floor(log2 width) - 2), at most 16: 7 stays 7, 13 -> 14, 37 -> 40, 100 -> 112, 300 -> 304), at most 25% and on
    average a few % more positions. Why: oneDNN (the CPU's bf16 matmuls) compiles and caches a kernel for every new
    shape and keeps it until the run ends, so a length per batch grows the process by ~0.3 MB per matmul shape and
    length (peak RSS +0.4 GiB over 24 DPO steps on SmolLM2-135M) and pays a compile each time; with few widths the
    kernels are reused: peak flat and the step faster (benchmarks/results/dpo.md, "Batch widths on the CPU")."""
    if multiple_of is None:
        multiple_of = min(1 << max(0, width.bit_length() - 3), 16)
    return -(-width // multiple_of) * multiple_of


def _encode(batch: dict[str, list], tokenizer, max_length: int) -> dict[str, list]:
    pair = batch.get("text_pair")
    enc = tokenizer(batch["text"], pair, truncation=True, max_length=max_length)
    out = {k: enc[k] for k in MODEL_INPUTS if k in enc}
    out["length"] = [len(ids) for ids in enc["input_ids"]]
    return out


def tokenize(dataset, tokenizer, max_length: int, desc: str = "Tokenizing"):
    """Canonical text dataset (text, [text_pair], [label]) -> input_ids, attention_mask, [token_type_ids],
    [labels], length. The result is cached by datasets; a second run with the same data, tokenizer and
    max_length reads it back instead of tokenising again."""
    drop = [c for c in ("text", "text_pair") if c in dataset.column_names]
    out = tokenizer_map(dataset, _encode, {"tokenizer": tokenizer, "max_length": max_length}, batched=True,
                        batch_size=1000, remove_columns=drop, desc=desc)
    if "label" in out.column_names:
        out = out.rename_column("label", "labels")
    return out


class TextCollator:
    """Pads a list of rows to the longest row (or to ``max_length``), rounded up by ``padded_width``.

    Adds ``loss_weight`` (1 for real examples, 0 for padding examples that only keep ranks in step).
    """

    def __init__(self, pad_token_id: int, *, pad_to: int | None = None, multiple_of: int | None = None):
        self.pad_token_id = pad_token_id
        self.pad_to = pad_to
        self.multiple_of = multiple_of

    def _width(self, rows: list[dict]) -> int:
        if self.pad_to and not self.multiple_of:
            return self.pad_to
        return padded_width(self.pad_to or max(len(r["input_ids"]) for r in rows), self.multiple_of)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        width = self._width(rows)
        n = len(rows)
        out: dict[str, torch.Tensor] = {}
        for key in MODEL_INPUTS:
            if key not in rows[0]:
                continue
            fill = self.pad_token_id if key == "input_ids" else 0
            t = torch.full((n, width), fill, dtype=torch.long)
            for i, r in enumerate(rows):
                seq = r[key][:width]
                t[i, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
            out[key] = t
        if "labels" in rows[0]:
            ys = [r["labels"] for r in rows]  # class ids, scores (regression) or multi-hot lists (multi-label)
            floats = isinstance(ys[0], (float, list))
            out["labels"] = torch.tensor(ys, dtype=torch.float32 if floats else torch.long)
        out["loss_weight"] = torch.tensor([r.get("loss_weight", 1.0) for r in rows], dtype=torch.float32)
        return out
