"""The causal-LM collator: rows of ``input_ids`` / ``labels`` / [``position_ids``] -> padded tensors.

``input_ids`` are padded with the pad id (the tokenizer's, else its EOS), ``labels`` with -100, ``position_ids``
continue the row's positions (last + 1, ...). ``attention_mask`` is emitted only when some row is padded and no row
restarts its positions: with restarts (packed documents) transformers builds the block-diagonal causal mask from
``position_ids`` when ``attention_mask`` is None, and padding at the end of a row cannot be seen by a causal model's
real tokens anyway. ``loss_weight`` (0 for the padding examples that keep ranks in step) is passed through.
"""

from __future__ import annotations

from typing import Any

import torch

from leantrain.data.text import padded_width

IGNORE = -100


class LMCollator:
    def __init__(self, pad_token_id: int, *, multiple_of: int | None = None, max_length: int | None = None):
        self.pad_token_id = int(pad_token_id)
        self.multiple_of = multiple_of
        self.max_length = max_length

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        n = len(rows)
        lengths = [len(r["input_ids"]) for r in rows]
        width = padded_width(max(lengths), self.multiple_of)
        if self.max_length:
            width = max(min(width, self.max_length), max(lengths))
        ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((n, width), IGNORE, dtype=torch.long)
        with_positions = any("position_ids" in r for r in rows)
        positions = torch.zeros((n, width), dtype=torch.long) if with_positions else None
        restarts = False
        for i, r in enumerate(rows):
            k = lengths[i]
            ids[i, :k] = torch.as_tensor(r["input_ids"], dtype=torch.long)
            labels[i, :k] = torch.as_tensor(r.get("labels", r["input_ids"]), dtype=torch.long)
            if positions is not None:
                if "position_ids" in r:
                    pos = torch.as_tensor(r["position_ids"], dtype=torch.long)
                    restarts = restarts or bool((pos[1:] <= pos[:-1]).any()) or (k > 0 and int(pos[0]) != 0)
                else:
                    pos = torch.arange(k, dtype=torch.long)
                positions[i, :k] = pos
                last = int(pos[-1]) if k else -1
                positions[i, k:] = torch.arange(last + 1, last + 1 + width - k, dtype=torch.long)
        out: dict[str, torch.Tensor] = {"input_ids": ids, "labels": labels}
        if positions is not None:
            out["position_ids"] = positions
        if any(k < width for k in lengths) and not restarts:
            mask = torch.zeros((n, width), dtype=torch.long)
            for i, k in enumerate(lengths):
                mask[i, :k] = 1
            out["attention_mask"] = mask
        out["loss_weight"] = torch.tensor([float(r.get("loss_weight", 1.0)) for r in rows], dtype=torch.float32)
        return out


def pad_id_of(tokenizer) -> int:  # noqa: ANN001
    """The pad id: the tokenizer's pad token, else its EOS, else 0."""
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if value is not None:
            return int(value)
    return 0
