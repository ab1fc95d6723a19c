"""The train and optim sections: how long and how big (epochs, steps, batch sizes, learning rate, losses,
``train.stop_when``) and the optimizer with its schedule."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator

from leantrain.config.metric_names import check_metric
from leantrain.config.base import MAX_MAGNITUDE, Section

ADAPTER_LR = 2e-4  # train.lr's default under peft.method=lora / qlora


def _positive_weights(v: Any, empty: str) -> Any:
    """Loss weights (a number or a list; 'balanced' passes): each positive and finite, a list not empty."""
    if isinstance(v, list) and not v:
        raise ValueError(empty)
    values = v if isinstance(v, list) else [v] if isinstance(v, (int, float)) else []
    bad = [w for w in values if not (math.isfinite(w) and 0 < w <= MAX_MAGNITUDE)]
    if bad:
        raise ValueError(f"each weight must be a positive finite number (got {bad[0]!r})")
    return v


class TrainConfig(Section):
    """How long and how big: epochs or steps, the global batch and its micro-batches, learning rate, cadences."""

    epochs: float = Field(3.0, gt=0, description="passes over the training data (ignored when max_steps > 0)")
    max_steps: int = Field(0, ge=0, description="optimizer steps; > 0 overrides epochs")
    batch_size: int = Field(32, gt=0, description="global batch: examples per optimizer step over all processes")
    micro_batch_size: int | str | None = Field(
        None, description="examples per process per forward pass; unset = batch_size / processes; "
        "auto = the largest that fits efficiency.memory_budget (accumulation makes up the rest)"
    )
    eval_batch_size: int | None = Field(None, gt=0, description="per process; unset = 2 x micro batch")

    @field_validator("micro_batch_size", mode="before")
    @classmethod
    def _micro(cls, v: Any) -> Any:
        if v is None or v == "auto":
            return v
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError("expected a positive integer or 'auto'")
        return v
    lr: float = Field(5e-5, gt=0, description=f"peak learning rate; unset with peft.method=lora/qlora: {ADAPTER_LR:g} "
                      "(adapters start at zero and take a larger step; see docs/lora-and-freezing.md)")
    head_lr: float | None = Field(
        None, gt=0, description="peak learning rate of the classifier head (the last layer, one output per label; its "
        "own parameter group); unset = the task's default: multi-label 200 x train.lr, other tasks train.lr"
    )
    max_grad_norm: float | None = Field(1.0, gt=0, description="gradient clipping; null = off")
    seed: int = Field(
        42, ge=0, lt=2**32,
        description="seeds the data order, the hold-out split, a new head's weights, augmentation and dropout "
                    "(0 .. 2**32-1)",
    )
    eval_every_steps: int = Field(
        0, ge=0, description="evaluate every N optimizer steps; 0 = at the end of each epoch (and of training)"
    )
    log_every_steps: int = Field(10, gt=0, description="log loss/lr/throughput every N optimizer steps")
    stop_when: str | None = Field(
        None, description="stop at the first evaluation meeting it, e.g. 'eval.accuracy>=0.85' (time to accuracy)"
    )
    warmup_steps_excluded: int = Field(
        3, ge=0, description="first optimizer steps left out of samples/s and tokens/s (compile, allocator warm-up)"
    )
    early_stopping_patience: int = Field(
        0, ge=0, description="stop after N evaluations without improvement of checkpoint.best_metric; 0 = off"
    )
    nonfinite: Literal["abort", "skip_step"] = Field(
        "abort", description="on a NaN/Inf loss or grad norm: abort (stop with a diagnostic; checked on logging "
        "steps and before each checkpoint) or skip_step (skip that update; one host sync per step)"
    )
    class_weights: Literal["balanced"] | list[float] | None = Field(
        None, description="single-label classification: per-class loss weights; unset = none; balanced = n_samples "
        "/ (n_classes x count of the class) over the training data (sklearn's); or [w0, w1, ...], one positive weight "
        "per class in label-id order. The loss is divided by the sum of the weights of the global batch's examples"
    )
    pos_weight: Literal["balanced"] | float | list[float] | None = Field(
        None, description="multi-label: weight of the positive term of each label's binary cross-entropy (torch's "
        "BCEWithLogitsLoss pos_weight); unset = 1; a number for every label; [w0, w1, ...] one per label in label "
        "order; balanced = negatives / positives of each label in the training data. The loss stays divided by "
        "examples x labels of the global batch"
    )

    loss: Literal["mse", "huber"] = Field(
        "mse", description="regression: mse (squared error) or huber (squared within train.huber_delta, linear "
        "beyond; less pulled by outliers); summed over the examples / the global batch's example count"
    )
    huber_delta: float = Field(
        1.0, gt=0, description="train.loss=huber: where the loss turns from squared to linear, in the units the model "
        "predicts (the standardised scale under data.standardize_targets)"
    )

    @field_validator("class_weights")
    @classmethod
    def _class_weights(cls, v: Any) -> Any:
        return _positive_weights(v, "expected 'balanced' or one weight per class, e.g. [1.0, 3.0]")

    @field_validator("pos_weight")
    @classmethod
    def _pos_weight(cls, v: Any) -> Any:
        return _positive_weights(v, "expected 'balanced', a number, or one weight per label, e.g. [1.0, 3.0]")

    @field_validator("stop_when")
    @classmethod
    def _stop_when(cls, v: str | None) -> str | None:
        if v is not None:
            check_metric(parse_stop_when(v)[0])
        return v


def parse_stop_when(text: str) -> tuple[str, str, float]:
    """'eval.accuracy>=0.85' -> ('accuracy', '>=', 0.85)."""
    import re

    m = re.fullmatch(r"\s*eval\.(\w+)\s*(>=|<=)\s*([-+0-9.eE]+)\s*", text)
    if not m:
        raise ValueError(f"expected eval.<metric> >= or <= a number, e.g. 'eval.accuracy>=0.85' (got {text!r})")
    return m.group(1), m.group(2), float(m.group(3))


def largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


class OptimConfig(Section):
    """The optimizer (one key switches it), weight decay, and the learning-rate schedule."""

    name: Literal["adamw", "adafactor", "adamw8bit", "sgd", "lion", "muon"] = Field(
        "adamw", description="adamw (torch, fused/foreach), adafactor (transformers), adamw8bit (bitsandbytes, "
        "extra leantrain[8bit]), sgd, lion (extra leantrain[lion]), muon (torch Muon for hidden 2-D weights + AdamW "
        "for the rest)"
    )
    weight_decay: float = Field(0.01, ge=0, description="decoupled weight decay (biases and norm weights excluded)")
    decay_norms_and_biases: bool = Field(
        False, description="also decay biases and LayerNorm/RMSNorm weights (parameters with ndim < 2)"
    )
    betas: tuple[float, float] | None = Field(
        None, description="unset = the optimizer's default: AdamW/8-bit/Muon's AdamW (0.9, 0.999), Lion (0.9, 0.99)"
    )
    eps: float = Field(1e-8, gt=0, description="AdamW / 8-bit AdamW epsilon")
    momentum: float | None = Field(
        None, ge=0, lt=1, description="sgd and muon momentum; unset = 0.9 for sgd, 0.95 for muon"
    )
    nesterov: bool | None = Field(None, description="Nesterov momentum for sgd and muon; unset = off for sgd, on for muon")
    adafactor_relative_step: bool = Field(
        False, description="Adafactor's own time-dependent step size: train.lr and optim.scheduler are then ignored"
    )
    scheduler: Literal["linear", "cosine", "constant", "inverse_sqrt"] = Field(
        "linear", description="learning-rate schedule after warm-up; stepped once per optimizer step"
    )
    warmup_ratio: float = Field(0.06, ge=0, lt=1, description="share of the steps spent warming up")
    warmup_steps: int | None = Field(None, ge=0, description="overrides warmup_ratio when set")
