"""The whole config: one typed section per component (``extra="forbid"`` everywhere) and the checks that span
sections. The sections live in ``model_data`` (model, data), ``training`` (train, optim) and ``run_options`` (the rest),
on the base in ``base``."""

from __future__ import annotations

import json
from typing import Any

import yaml
from pydantic import Field, field_validator, model_validator

from leantrain.config.distill import DistillConfig
from leantrain.config.grpo import GrpoConfig
from leantrain.config.model_data import DataConfig, ModelConfig
from leantrain.config.preference import PreferenceConfig, check_preference
from leantrain.config.problem_type import check_problem_type
from leantrain.config.run_options import (CheckpointConfig, DistributedConfig, EfficiencyConfig, EvalConfig,
                                          PeftConfig, ReportConfig)
from leantrain.config.base import Section
from leantrain.config.training import ADAPTER_LR, OptimConfig, TrainConfig, largest_divisor


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    efficiency: EfficiencyConfig = Field(default_factory=EfficiencyConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    peft: PeftConfig = Field(default_factory=PeftConfig)
    preference: PreferenceConfig = Field(default_factory=PreferenceConfig)
    grpo: GrpoConfig = Field(default_factory=GrpoConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)
    output_dir: str | None = Field(None, description="run folder; unset = runs/<date-time>")

    @field_validator("output_dir")
    @classmethod
    def _nonempty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty")
        return v

    @model_validator(mode="after")
    def _batch_sizes_divide(self) -> "Config":
        t = self.train
        if isinstance(t.micro_batch_size, int) and t.batch_size % t.micro_batch_size:
            raise ValueError(
                f"train.batch_size={t.batch_size} is not a multiple of train.micro_batch_size={t.micro_batch_size}; "
                f"use a micro batch that divides it, e.g. {largest_divisor(t.batch_size, t.micro_batch_size)}"
            )
        d = self.distributed
        if d.strategy == "deepspeed" and not d.deepspeed_config:
            raise ValueError("distributed.strategy=deepspeed needs distributed.deepspeed_config=path/to/zero.json")
        if self.peft.method != "none" and d.strategy in ("fsdp", "deepspeed"):
            raise ValueError(f"peft.method={self.peft.method} with distributed.strategy={d.strategy} is not supported: "
                             "the adapters are a small share of the parameters, so sharding buys little, and merging "
                             "them into sharded weights at save time is not implemented; use DDP (the default)")
        if self.peft.method == "lora" and not self.peft.merge and (self.model.config or self.model.config_type):
            raise ValueError("peft.method=lora with peft.merge=false on a model built from model.config / "
                             "model.config_type would save only the adapter, and the base's random initial weights "
                             "are saved nowhere: the adapter could never be loaded again; use peft.merge=true (the "
                             "default: the merged model is saved), or train the model in full (peft.method=none)")
        if self.peft.method == "qlora":  # the device (CUDA only) is checked before any worker or model starts
            if self.model.config or self.model.config_type:
                raise ValueError("peft.method=qlora quantises pretrained weights; a model built from model.config / "
                                 "model.config_type has none (nothing to quantise): use peft.method=lora or train it "
                                 "in full")
            if self.efficiency.precision not in ("auto", "bf16"):
                raise ValueError(f"peft.method=qlora with efficiency.precision={self.efficiency.precision} is not "
                                 "supported: the 4-bit layers compute in bf16 (bnb_4bit_compute_dtype=bfloat16); "
                                 "use efficiency.precision=bf16 (or auto)")
        if d.local_sgd_steps > 1 and d.strategy in ("fsdp", "deepspeed"):
            raise ValueError(f"distributed.local_sgd_steps works with DDP only, not distributed.strategy={d.strategy}")
        if d.strategy == "deepspeed" and (refused := deepspeed_refusals(self)):
            raise ValueError("distributed.strategy=deepspeed cannot be combined with " + "; ".join(refused))
        return self

    @model_validator(mode="after")
    def _adapter_lr(self) -> "Config":
        """LoRA / QLoRA without a train.lr of the user's: ADAPTER_LR (what TRL and LLaMA-Factory users expect for
        adapters, which start at zero and need a larger step than a full fine-tune)."""
        if self.peft.method != "none" and "lr" not in self.train.model_fields_set:
            self.train.lr = ADAPTER_LR
        return self

    @model_validator(mode="after")
    def _preference(self) -> "Config":
        check_preference(self.preference, self.peft.method, self.data, self.model.task)
        return self

    @model_validator(mode="after")
    def _problem_type(self) -> "Config":
        check_problem_type(self.model.task, self.model.config_overrides)
        return self

    @model_validator(mode="after")
    def _best_metric_needed(self) -> "Config":
        if self.checkpoint.best_metric is None:
            if self.checkpoint.save_model == "best":
                raise ValueError("checkpoint.save_model=best needs checkpoint.best_metric, e.g. eval.f1_macro")
            if self.train.early_stopping_patience:
                raise ValueError("train.early_stopping_patience needs checkpoint.best_metric, e.g. eval.f1_macro")
        return self

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def deepspeed_refusals(cfg: "Config") -> list[str]:
    """The keys of ``cfg`` that DeepSpeed ZeRO (as leantrain drives it through Accelerate) cannot combine with, each
    with why ("key=value: why"); empty when none."""
    refused = []
    if cfg.efficiency.compile is True:  # auto stays off under DeepSpeed
        refused.append("efficiency.compile=true: leantrain compiles the model in place before DeepSpeed wraps it in "
                       "its engine, whose ZeRO hooks that compiled graph would bypass; set efficiency.compile=false")
    if cfg.efficiency.precision == "fp8":
        refused.append("efficiency.precision=fp8: DeepSpeed runs its own mixed precision (the bf16 / fp16 sections of "
                       "distributed.deepspeed_config); use efficiency.precision=bf16")
    if cfg.train.micro_batch_size == "auto":
        refused.append("train.micro_batch_size=auto: the memory model measures an unsharded model, not ZeRO's "
                       "partitioned parameters, gradients and optimizer state; set train.micro_batch_size")
    if cfg.optim.name in ("muon", "adafactor"):
        refused.append(f"optim.name={cfg.optim.name}: it needs each weight matrix's 2-D shape, and ZeRO hands the "
                       "optimizer flat 1-D partitions; use optim.name=adamw")
    return refused
