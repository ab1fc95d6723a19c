"""Causal language modelling (``model.task=causal-lm``): next-token prediction on blocks of tokens (the ``tokens``
data side: rows of ``input_ids``, unshifted ``labels`` with -100 where there is no target, ``targets`` = how many
shifted targets a row holds).

The unit is the target token. The task owns its labels: ``token_losses(model, batch)`` runs the forward and returns
the fp32 cross-entropy of each shifted target (position i predicts ``labels[i + 1]``; -100 is ignored), through one
call, ``leantrain.modeling.token_losses.token_losses``: the output loss ``efficiency.chunked_loss`` installed (the
chunked loss or Liger's kernel, on the forward's final hidden states: the ``tokens x vocab`` logits never exist) or
the plain logits; it reads nothing but the batch (input columns and ``labels``), so a task that compares
sequences (two per row, a frozen reference model) calls it on its own batches and models. ``step.forward_loss`` is the
sum over rows of ``loss_weight`` x the row's summed token losses; ``count`` is the sum of
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
from leantrain.errors import ConfigError, UserError
from leantrain.methods.registry import CardText, Task, register
from leantrain.methods.row_counts import RowCounts
from leantrain.methods.traits import Traits
from leantrain.modeling.chunked_loss import keeps_logits
from leantrain.modeling import model_name
from leantrain.modeling.load import load_tokenizer
from leantrain.modeling.token_losses import TokenLosses, logit_losses, token_losses


class CausalLMModel(Task.parts.model):
    def fields(self, label_names: list[str]) -> dict:
        return {}  # no head to size: the output layer is the vocabulary's

    def check_architecture(self, cfg, config) -> None:  # noqa: ANN001 - a leantrain Config, a transformers config
        """A causal LM (SFT, preference tuning, GRPO) needs a model whose attention sees only earlier tokens: an encoder
        (BERT, RoBERTa, ... whose causal-LM class runs bidirectional attention unless its config says ``is_decoder``)
        would train on what it can see ahead. Exit 2 naming the model type, before any weight loads."""
        from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES  # lazy: heavy

        kind = getattr(config, "model_type", "")
        decoder = cfg.model.config_overrides.get("is_decoder", getattr(config, "is_decoder", False))
        if kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not decoder and not getattr(config, "is_encoder_decoder", False):
            key = (f"model.config={cfg.model.config}" if cfg.model.config
                   else f"model.name={cfg.model.name or model_name(cfg.model)}")
            raise ConfigError(
                f"{key}: model type {kind} is an encoder (bidirectional attention: its config has is_decoder=false), "
                f"and model.task={self.task.name} trains a causal language model, each token predicted from the ones "
                "before it (an encoder sees the token it predicts); choose a decoder (e.g. model.name=smollm2-135m), "
                "or train this model as a reward model (model.task=reward-model) or a classifier")

    def scratch_fields(self, cfg) -> dict:  # noqa: ANN001 - a ModelConfig
        """Config fields of a model built from a config: the vocabulary and special tokens follow the tokenizer
        (``model.tokenizer``)."""
        tokenizer = load_tokenizer(cfg, say=False)
        fields = {"vocab_size": len(tokenizer)}
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(tokenizer, name, None)
            if value is not None:
                fields[name] = value
        return fields

    def calibration_labels(self, model, input_ids: torch.Tensor) -> torch.Tensor:
        return input_ids  # every next token is a target


class CausalLMStep(Task.parts.step):
    def forward_loss(self, model, batch: dict) -> tuple[torch.Tensor, object]:
        """The weighted sum of the token losses (rows of weight 0, which only keep processes in step, weigh 0; Liger's
        kernel gets their targets masked: ``leantrain.modeling.token_losses``); no outputs."""
        losses = self.task.forward_token_losses(model, batch, batch["loss_weight"]).losses
        return (losses.sum(-1) * batch["loss_weight"]).sum(), None

    def loss_sum(self, outputs, batch: dict) -> torch.Tensor:
        """The loss sum from plain outputs (logits ``[B, T, V]``)."""
        return (logit_losses(outputs.logits, batch["labels"])[0].sum(-1) * batch["loss_weight"]).sum()


class CausalLMData(Task.parts.data):
    def __init__(self, task) -> None:  # noqa: ANN001 - the method
        super().__init__(task)
        self.counts = RowCounts()  # per-row counts of each dataset, read once

    def count(self, dataset, indices) -> int:
        """Target tokens in the rows ``indices`` (padding indices, negative, hold none), from the ``targets`` column
        (read once per dataset)."""
        return self.counts.total(dataset, "targets", indices)

    def throughput_tokens(self, dataset, indices) -> int:
        """tokens/s counts target tokens (the tokens the model learns from)."""
        return self.count(dataset, indices)


class CausalLMEvaluation(Task.parts.evaluation):
    def outputs(self, model, batch: dict) -> tuple:
        """Per row: (summed loss of its targets, its target count), fp64: two numbers gathered instead of logits."""
        labels = batch["labels"]
        losses = self.task.token_losses(model, batch).double().sum(-1)
        counts = (labels[:, 1:] != -100).sum(-1).double()
        return (torch.stack([losses, counts], dim=-1),)

    def batch(self, values: torch.Tensor, labels=None) -> dict:
        return {"loss_sum": values[:, 0], "tokens": values[:, 1]}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        tokens = float(values["tokens"].sum())
        loss = float(values["loss_sum"].sum() / tokens) if tokens else math.nan
        return {"loss": loss, "perplexity": math.exp(loss) if math.isfinite(loss) and loss < 700 else math.inf,
                "samples": int(len(values["tokens"])), "tokens": int(tokens)}

    def headline(self, ev: dict) -> str:
        return f"eval loss: {ev['loss']:.4f}  perplexity: {ev['perplexity']:.2f} ({ev.get('tokens', 0):,} tokens)"


class CausalLMReport(Task.parts.report):
    def card_rows(self, summary: dict, config: dict) -> list[tuple[str, object]]:
        """The model card's training-data lines: corpus, tokens seen, block size, final perplexity."""
        data, tr, ev = config.get("data") or {}, summary.get("train") or {}, summary.get("eval") or {}
        rows = [("corpus", data.get("train")), ("eval data", data.get("eval")),
                ("block size", data.get("block_size")), ("tokens seen (targets)", tr.get("tokens_seen")),
                ("final eval loss", ev.get("loss")), ("final eval perplexity", ev.get("perplexity"))]
        return [(k, v) for k, v in rows if v is not None]


class CausalLMPrediction(Task.parts.prediction):
    def check(self, model_dir: str) -> None:
        """A language model has no labels to predict (exit 2): ``leantrain generate`` continues text, ``leantrain eval``
        measures its loss and perplexity."""
        raise UserError(f"{model_dir} is a language model ({self.task.name}): it has no labels to predict; continue "
                        f"text with `leantrain generate {model_dir} --prompt \"...\"`, or measure its loss and "
                        f"perplexity on a file with `leantrain eval {model_dir} data.eval=path`")


@dataclasses.dataclass(frozen=True)
class CausalLM(Task):
    """Next-token prediction: the loss of each target token, summed; the count of target tokens."""

    parts = dataclasses.replace(Task.parts, model=CausalLMModel, step=CausalLMStep, data=CausalLMData,
                                evaluation=CausalLMEvaluation, prediction=CausalLMPrediction, report=CausalLMReport)

    def forward_token_losses(self, model, batch: dict, row_weights=None, keep: int | None = None,
                             entropy: bool = False) -> TokenLosses:
        """(per-token losses, entropy or None) of ``step.forward`` on ``batch``: ``token_losses``, through
        ``leantrain.modeling.token_losses.token_losses`` (``entropy``: each position's, from plain logits).
        ``row_weights``: the rows' ``loss_weight`` when the losses are weighted by them (Liger's kernel masks the rows
        of weight 0). ``keep``: the last ``keep`` shifted targets alone (``[B, keep]``), the output layer run on their
        positions only (transformers' ``logits_to_keep``; a model without it computes them all, then they are cut)."""
        labels, inputs, cut = batch["labels"], batch, None
        if keep is not None and keeps_logits(model):
            labels, inputs = labels[:, -(keep + 1):], {**batch, "logits_to_keep": keep + 1}
        elif keep is not None:
            cut = slice(-keep, None)
        out = token_losses(model, lambda: self.step.forward(model, inputs), labels, entropy=entropy,
                           row_weights=row_weights)
        if cut is None:
            return out
        return TokenLosses(out.losses[:, cut], None if out.entropy is None else out.entropy[:, cut])

    def token_losses(self, model, batch: dict, keep: int | None = None) -> torch.Tensor:
        """Per-token losses ``[B, T-1]`` (fp32, 0 where the shifted label is -100) of ``model`` on ``batch``
        (``input_ids``, ``attention_mask``, ..., unshifted ``labels [B, T]``): through the chunked output layer when
        installed, else from the plain logits; ``[B, keep]``: the last ``keep`` alone (``forward_token_losses``)."""
        return self.forward_token_losses(model, batch, keep=keep).losses



CAUSAL_LM_TASK = register(CausalLM(
    task_spec(CAUSAL_LM),
    Traits(labels="none", unit="tokens", auto_model="AutoModelForCausalLM", loads_as="text-generation",
           speed_unit="tokens", eval_row_kind="blocks", token_blocks=True, headline_loss=True,
           scratch_needs_tokenizer=True, model_mapping="MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    CardText("causal language modelling", "causal language model", '"Once upon a time", max_new_tokens=40',
             "generator")))
