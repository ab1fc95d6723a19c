"""``model.pooling``: what a BERT-style sequence classifier (classification, regression, multi-label) classifies
from. ``AutoModelForSequenceClassification`` on a BERT feeds the head ``tanh(W h_[CLS] + b)``, the pretrained
*pooler*. Some checkpoints ship a pooler that was never trained: the packaged all-MiniLM-L6-v2 is a
sentence-transformers model (trained through mean pooling), its pooler weight has std 0.009 (its initialiser's is
0.02) and its output barely varies between texts (per-dimension std ~0.04 against ~0.2 for the first token), so
the head starts from a near-constant input and the loss sits at the label prior (issue 14).

- ``pooler``: the checkpoint's pooler, as transformers loads it.
- ``reinit``: the pooler's dense layer re-initialised as transformers initialises a new one (normal, std
  ``initializer_range``; bias 0; from ``train.seed``), then trained with the rest.
- ``cls``: the pooler's dense layer set to the identity (bias 0): the head starts from ``tanh(h_[CLS])``.
- ``auto`` (default): whether the pooler looks untrained (below) is logged with the numbers; an untrained-looking
  pooler is replaced as the task says (``Traits.untrained_pooler``): ``cls`` for multi-label (issue 26: on Reuters-21578
  a head reading ``tanh(h_[CLS])`` beat one reading the untrained pooler, benchmarks/results/multilabel-reuters.md "Multi-label default
  on Reuters-21578"), kept (``pooler``) for the other tasks: re-initialising it measured worse at 60 steps on SST-2
  (0.696 vs 0.764 accuracy) and STS-B (Pearson 0.016 vs 0.099), and ``cls`` is not measured on them at full length.

Every choice changes only the pooler's weights, so the saved model is a plain ``BertForSequenceClassification``:
``pipeline()`` / ``AutoModelForSequenceClassification`` load it and give the same outputs as training saw. Mean
pooling (what sentence-transformers uses) cannot be written as a BERT pooler, so it is not offered: a saved model
would need custom code to load.

"Looks untrained": the pooler weight's std is under ``WEIGHT_RATIO`` x ``initializer_range`` (a fresh layer's)
*and* its output's per-dimension std over a few fixed random inputs is under ``OUTPUT_RATIO`` x the first token's.
Models without such a pooler (RoBERTa, DistilBERT, ... have their own head) are left as they are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

log = logging.getLogger("leantrain")

WEIGHT_RATIO = 0.6
OUTPUT_RATIO = 0.25
CHOICES = ("auto", "pooler", "cls", "reinit")


@dataclass(frozen=True)
class PoolerStats:
    weight_std: float  # std of the pooler's dense weight
    init_std: float  # the config's initializer_range: a freshly initialised layer's std
    output_ratio: float  # per-dimension std of the pooled output / that of the first token, over random inputs

    @property
    def untrained(self) -> bool:
        return self.weight_std < WEIGHT_RATIO * self.init_std and self.output_ratio < OUTPUT_RATIO

    def describe(self) -> str:
        return (f"pooler weight std {self.weight_std:.4f} (a fresh layer: {self.init_std:.4f}), its output varies "
                f"{self.output_ratio:.2f}x as much as the first token's")


def bert_pooler(model: nn.Module) -> nn.Module | None:
    """The BERT-style pooler (a module with a ``dense`` Linear) the classification head reads, or None."""
    pooler = getattr(getattr(model, "base_model", None), "pooler", None)
    dense = getattr(pooler, "dense", None)
    return pooler if isinstance(dense, nn.Linear) and dense.in_features == dense.out_features else None


@torch.no_grad()
def pooler_stats(model: nn.Module, batch: int = 16, length: int = 16) -> PoolerStats | None:
    """The numbers ``auto`` decides by; None when the model has no BERT-style pooler."""
    pooler = bert_pooler(model)
    if pooler is None:
        return None
    base, cfg = model.base_model, model.config
    g = torch.Generator().manual_seed(0)  # fixed inputs: the same decision on every process and every run
    vocab = int(getattr(cfg, "vocab_size", 1000))
    ids = torch.randint(min(1000, vocab // 2), vocab, (batch, length), generator=g)
    device = next(model.parameters()).device
    was_training = base.training
    base.eval()
    try:
        out = base(input_ids=ids.to(device), attention_mask=torch.ones_like(ids, device=device))
    finally:
        base.train(was_training)
    first = out.last_hidden_state[:, 0].float().std(0).mean()
    pooled = out.pooler_output.float().std(0).mean()
    return PoolerStats(weight_std=float(pooler.dense.weight.float().std()),
                       init_std=float(getattr(cfg, "initializer_range", 0.02)),
                       output_ratio=float(pooled / first) if first > 0 else 0.0)


@torch.no_grad()
def apply_pooling(model: nn.Module, setting: str, untrained: str = "pooler") -> str:
    """Set the model's pooler for ``model.pooling`` (logged, with why); ``untrained``: what ``auto`` does with an
    untrained-looking pooler (the task's choice). Returns what was done: ``pooler``, ``reinit``, ``cls`` or ``none``
    (no BERT-style pooler)."""
    stats = pooler_stats(model)
    if stats is None:
        if setting in ("cls", "reinit"):
            log.warning("warning: model.pooling=%s: %s has no BERT-style pooler; its own head is used",
                        setting, type(model).__name__)
        return "none"
    choice = setting
    if setting == "auto":
        choice = untrained if stats.untrained else "pooler"
        why = ("kept" if not stats.untrained else
               "untrained-looking, kept (model.pooling=cls or reinit to try)" if choice == "pooler" else
               f"untrained-looking: {choice}, the task's choice for it (model.pooling=pooler to keep it)")
        log.info("pooling: %s (model.pooling=auto: %s; %s)", choice, stats.describe(), why)
    else:
        log.info("pooling: %s (model.pooling; %s)", choice, stats.describe())
    dense = bert_pooler(model).dense
    if choice == "reinit":
        dense.weight.normal_(0.0, stats.init_std)
        dense.bias.zero_()
    elif choice == "cls":
        dense.weight.copy_(torch.eye(dense.out_features, dtype=dense.weight.dtype))
        dense.bias.zero_()
    return choice
