"""Collators of the preference data sides (``leantrain.data.lm.preference``): B rows -> one (2B, T) batch, so that both
sequences of every row go through one forward.

- ``PairCollator`` (``pairs``): rows 0..B-1 the chosen, B..2B-1 the rejected sequences; ``labels`` -100 on padding.
- ``FeedbackCollator`` (``feedback``): rows 0..B-1 the examples, B..2B-1 their KL rows; ``desirable`` (B,).
- ``PairCollator(labels=False)`` (``scored-pairs``): a reward model's chosen then rejected inputs, no labels.

All right-pad with the pad id, give ``attention_mask`` (2B, T) and ``loss_weight`` (B,) (0 for the padding rows
that keep ranks in step), and pass precomputed reference log-probs as ``ref_logps`` (B, 2) float32 when the rows
carry both of their columns.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from leantrain.data.text import padded_width

IGNORE = -100
PAIR_REF = ("ref_chosen_logps", "ref_rejected_logps")
FEEDBACK_REF = ("ref_logps", "ref_kl_logps")


def pad(sequences: Sequence[Sequence[int]], value: int, multiple_of: int | None = None) -> torch.Tensor:
    """Right-padded (N, T) long tensor; T the longest, rounded up to ``multiple_of``."""
    width = max((len(s) for s in sequences), default=0)
    width = padded_width(width, multiple_of)
    out = torch.full((len(sequences), width), value, dtype=torch.long)
    for i, s in enumerate(sequences):
        out[i, :len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return out


class PairCollator:
    """Rows of two sequences each (``<first>input_ids`` / ``<second>input_ids``, and their labels) -> a (2B, T)
    batch: the first sequence of every row, then the second."""

    def __init__(self, pad_token_id: int, *, multiple_of: int | None = None, labels: bool = True,
                 names: tuple[str, str] = ("chosen_", "rejected_"), ref: tuple[str, str] = PAIR_REF):
        self.pad_token_id = int(pad_token_id)
        self.multiple_of = multiple_of
        self.labels = labels
        self.names = names
        self.ref = ref

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        seqs = [r[f"{n}input_ids"] for n in self.names for r in rows]
        ids = pad(seqs, self.pad_token_id, self.multiple_of)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            mask[i, :len(s)] = 1
        out = {"input_ids": ids, "attention_mask": mask}
        if self.labels:
            out["labels"] = pad([r[f"{n}labels"] for n in self.names for r in rows], IGNORE, self.multiple_of)
        if rows and all(k in rows[0] for k in self.ref):
            out["ref_logps"] = torch.tensor([[float(r[k]) for k in self.ref] for r in rows], dtype=torch.float32)
        out["loss_weight"] = torch.tensor([float(r.get("loss_weight", 1.0)) for r in rows], dtype=torch.float32)
        return out


class FeedbackCollator(PairCollator):
    """Feedback rows -> the examples then their KL rows (2B, T), with ``desirable`` (B,) long."""

    def __init__(self, pad_token_id: int, *, multiple_of: int | None = None):
        super().__init__(pad_token_id, multiple_of=multiple_of, names=("", "kl_"), ref=FEEDBACK_REF)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        out = super().__call__(rows)
        out["desirable"] = torch.tensor([int(r["desirable"]) for r in rows], dtype=torch.long)
        return out
