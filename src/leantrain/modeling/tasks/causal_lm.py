"""Causal language modelling (``model.task=causal-lm``): next-token prediction on blocks of tokens (the ``tokens``
data side: rows of ``input_ids``, unshifted ``labels`` with -100 where there is no target, ``targets`` = how many
shifted targets a row holds).

The unit is the target token. ``loss_sum`` is the sum over rows of ``loss_weight`` x the summed fp32 cross-entropy
of the row's shifted targets (position i predicts ``labels[i + 1]``; -100 is ignored), from
``leantrain.modeling.chunked_loss.per_token_losses`` (the plain logits or the chunked path); ``count`` is the sum of
the rows' ``targets``, read from an array in memory. The engine divides the sum over all micro-batches and processes
by that count of the global batch, so the loss is the mean over the global batch's target tokens, whatever the
accumulation and the number of processes.

Evaluation gathers two numbers per row (its summed loss and its target count) instead of the logits, and reports
``loss`` = the sum of the losses / the number of target tokens of the whole eval set (exact under several
processes: sums and counts, never a mean of means) and ``perplexity`` = exp(loss).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from leantrain.config.tasks import CAUSAL_LM, task_spec
from leantrain.modeling.chunked_loss import per_token_losses
from leantrain.modeling.tasks.registry import CardText, Task, register
from leantrain.modeling.tasks.row_counts import RowCounts


@dataclasses.dataclass(frozen=True)
class CausalLM(Task):
    """Next-token prediction: the loss of each target token, summed; the count of target tokens."""

    _counts: RowCounts = dataclasses.field(default_factory=RowCounts, compare=False, repr=False)  # targets per row

    scratch_needs_tokenizer = True  # a new model's vocabulary is model.tokenizer's

    # -- model
    def model_fields(self, label_names: list[str]) -> dict:
        return {}  # no head to size: the output layer is the vocabulary's

    def scratch_fields(self, tokenizer) -> dict:
        """Config fields of a model built from a config: the vocabulary and special tokens follow the tokenizer."""
        fields = {"vocab_size": len(tokenizer)}
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(tokenizer, name, None)
            if value is not None:
                fields[name] = value
        return fields

    # -- training
    def loss_sum(self, outputs, batch: dict) -> torch.Tensor:
        per_row = per_token_losses(outputs, batch["labels"]).sum(-1)
        return (per_row * batch["loss_weight"]).sum()

    def count(self, dataset, indices) -> int:
        """Target tokens in the rows ``indices`` (padding indices, negative, hold none), from the ``targets`` column
        (read once per dataset)."""
        return self._counts.total(dataset, "targets", indices)

    def throughput_tokens(self, dataset, indices) -> int:
        """tokens/s counts target tokens (the tokens the model learns from)."""
        return self.count(dataset, indices)

    # -- evaluation
    def eval_outputs(self, outputs, batch: dict) -> tuple:
        """Per row: (summed loss of its targets, its target count), fp64: two numbers gathered instead of logits."""
        labels = batch["labels"]
        losses = per_token_losses(outputs, labels).double().sum(-1)
        counts = (labels[:, 1:] != -100).sum(-1).double()
        return (torch.stack([losses, counts], dim=-1),)

    def eval_batch(self, values: torch.Tensor, labels=None) -> dict:
        return {"loss_sum": values[:, 0], "tokens": values[:, 1]}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        tokens = float(values["tokens"].sum())
        loss = float(values["loss_sum"].sum() / tokens) if tokens else math.nan
        return {"loss": loss, "perplexity": math.exp(loss) if math.isfinite(loss) and loss < 700 else math.inf,
                "samples": int(len(values["tokens"])), "tokens": int(tokens)}

    def headline(self, ev: dict) -> str:
        return f"eval loss: {ev['loss']:.4f}  perplexity: {ev['perplexity']:.2f} ({ev.get('tokens', 0):,} tokens)"

    def card_rows(self, summary: dict, config: dict) -> list[tuple[str, object]]:
        """The model card's training-data lines: corpus, tokens seen, block size, final perplexity."""
        data, tr, ev = config.get("data") or {}, summary.get("train") or {}, summary.get("eval") or {}
        rows = [("corpus", data.get("train")), ("eval data", data.get("eval")),
                ("block size", data.get("block_size")), ("tokens seen (targets)", tr.get("tokens_seen")),
                ("final eval loss", ev.get("loss")), ("final eval perplexity", ev.get("perplexity"))]
        return [(k, v) for k, v in rows if v is not None]


CAUSAL_LM_TASK = register(CausalLM(
    task_spec(CAUSAL_LM), "AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "tokenizer",
    CardText("causal language modelling", "causal language model", '"Once upon a time", max_new_tokens=40'),
    unit="tokens"))
