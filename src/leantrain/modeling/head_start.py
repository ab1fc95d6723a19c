"""How a freshly initialised classifier head starts (issue 26): its own learning rate and, for multi-label, its bias.

A new head (``nn.Linear``, weights ~N(0, 0.02), bias 0) under AdamW at the body's learning rate (5e-5) moves each
weight by about 5e-5 per step. On multi-label data with rare labels (Reuters-21578: 90 labels, most on under 1% of
texts) the head first has to bring every label's logit from 0 (p = 0.5) to the label's prior (p = 0.01 is a logit of
-4.6); at that speed that takes most of a short run, and the model ends at the prior: every text gets the same
ranking of labels, and the tuned threshold picks the most frequent one (benchmarks/results/multilabel-reuters.md, "Multi-label default
on Reuters-21578"). Two remedies, each the task's to choose (``Traits.head_lr_factor`` / ``Model.start_head``; multi-label
takes both, the other tasks neither):

- the head's parameters in their own optimizer group at ``train.head_lr`` (unset: train.lr x the task's factor);
- a fresh head's bias set to the labels' prior log-odds (``prior_logits``), so training starts at the prior and
  spends its steps on what tells the texts apart (the "prior" initialisation of RetinaNet's classifier).

The head is found as ``head_reuse.find_head`` finds it: the last Linear with one output per label.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from leantrain.modeling.head_reuse import find_head


def head_parameters(model: nn.Module, num_labels: int) -> list[nn.Parameter]:
    """The trainable parameters of ``model``'s classifier head (the last Linear with ``num_labels`` outputs);
    empty when there is none."""
    found = find_head(model, num_labels)
    return [] if found is None else [p for p in found[1].parameters() if p.requires_grad]


def prior_logits(multi_hot, smoothing: float = 0.5) -> np.ndarray:
    """log(p / (1 - p)) per label, p = (positives + smoothing) / (rows + 2 x smoothing): finite for a label that is
    on no row or on every row."""
    hot = np.asarray(multi_hot, dtype=np.float64)
    p = (hot.sum(0) + smoothing) / (len(hot) + 2 * smoothing)
    return np.log(p / (1 - p))


@torch.no_grad()
def set_fresh_bias(model: nn.Module, values) -> int:
    """Set the rows of the head's bias that are exactly 0 (a fresh head's or fresh rows of a reused one; a trained
    bias is not) to ``values``; returns how many rows were set (0 without a head or a bias)."""
    found = find_head(model, len(values))
    bias = None if found is None else found[1].bias
    if bias is None:
        return 0
    fresh = bias == 0
    bias[fresh] = torch.as_tensor(np.asarray(values), dtype=bias.dtype, device=bias.device)[fresh]
    return int(fresh.sum())


def head_group(model: nn.Module, num_labels: int, lr: float, head_lr: float | None, factor: float
               ) -> tuple[list[nn.Parameter], float | None]:
    """(the head's parameters, their peak learning rate) for ``build_optimizer``: ``train.head_lr`` when set, else
    ``lr`` x the task's ``factor``; ([], None) when that is ``lr`` itself or the model has no such head."""
    rate = head_lr if head_lr is not None else lr * factor
    params = head_parameters(model, num_labels) if num_labels and rate != lr else []
    return (params, rate) if params else ([], None)
