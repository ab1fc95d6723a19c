"""Efficiency choices made before the model exists: mixed precision (before the Accelerator), the attention
implementation, torch.compile and the weight casts (``resolve_model_choices``), the output loss's sizes; what they
resolve to is made on the model by the connector's converters (``connector.py``, ``converters.py``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from torch import nn

from leantrain.config import Config, EfficiencyConfig
from leantrain.errors import ConfigError
from leantrain.modeling.attention import attention_support, choose_attention, flash_attn_usable, fp32_uses
from leantrain.modeling.chunked_loss import OutputLossNote, apply_chunked_loss, output_layer
from leantrain.modeling.load import load_config
from leantrain.modeling.output_loss import plain_logits_bytes
from leantrain.methods import Task
from leantrain.perf.auto_micro_batch import default_budget, parse_bytes

log = logging.getLogger("leantrain")

# Accelerate's names for leantrain's precisions.
ACCELERATE_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_native_bf16() -> bool:
    """bf16 matmuls run natively (AVX512-BF16 or AMX-BF16; Apple silicon has no bf16 autocast win on CPU)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def resolve_precision(requested: str, device_type: str) -> tuple[str, str]:
    """(precision, why) for ``efficiency.precision`` on a ``cpu``/``cuda``/``mps`` device.

    Raises ConfigError for a choice the hardware cannot run well or at all (fp16/fp8 on CPU, bf16 on a GPU
    without it, fp8 without a backend or without fp8 tensor cores).
    """
    if device_type == "cuda":
        bf16 = torch.cuda.is_bf16_supported()
        name = torch.cuda.get_device_name()
        if requested == "auto":
            return ("bf16", f"{name} supports bf16") if bf16 else \
                ("fp16", f"{name} has no bf16: fp16 with a dynamic grad scaler")
        if requested == "bf16" and not bf16:
            raise ConfigError(f"efficiency.precision=bf16: {name} has no bf16 support; use fp16 (grad scaler) or auto")
        if requested == "fp8":
            from accelerate.utils import is_fp8_available

            cc = torch.cuda.get_device_capability()
            if cc < (8, 9):
                raise ConfigError(f"efficiency.precision=fp8: {name} (compute capability {cc[0]}.{cc[1]}) has no fp8 "
                                  "tensor cores (needs 8.9+: L4, L40S, H100, H200, B200); use bf16")
            if not is_fp8_available():
                raise ConfigError("efficiency.precision=fp8 needs an fp8 backend for Accelerate: "
                                  "pip install transformer-engine (or torchao)")
        return requested, "as configured"
    if requested in ("fp16", "fp8"):
        why = ("fp16 on CPU has no native matmul path (~100x slower than fp32 here) and no grad scaler"
               if requested == "fp16" else "fp8 training needs fp8 tensor cores (an L4/H100-class GPU)")
        raise ConfigError(f"efficiency.precision={requested} is not supported on {device_type}: {why}; "
                          "use fp32, bf16 or auto")
    if requested == "auto":
        if device_type == "cpu" and cpu_has_native_bf16():
            return "bf16", "this CPU runs bf16 natively (avx512_bf16/amx_bf16): bf16 autocast"
        return "fp32", f"no native bf16 on this {device_type}: fp32"
    if requested == "bf16" and device_type == "cpu" and not cpu_has_native_bf16():
        log.warning("efficiency.precision=bf16 on a CPU without avx512_bf16/amx_bf16: emulated, likely slower than fp32")
    return requested, "as configured"


def output_loss_sizes(model: nn.Module, eff: EfficiencyConfig, device: torch.device, micro_batch: int | str | None,
                      block_size: int | None) -> tuple[int | None, int | None]:
    """(bytes of a micro-batch's fp32 logits with their gradient, the memory budget) for
    ``efficiency.chunked_loss=auto`` on a CUDA ``device``; (None, None) elsewhere or where not known yet (an auto
    micro-batch, no block size, no plain output layer)."""
    layer = output_layer(model)
    if device.type != "cuda" or eff.chunked_loss != "auto" or layer is None:
        return None, None
    budget = (parse_bytes(eff.memory_budget) if eff.memory_budget is not None else default_budget(device)[0])
    if not isinstance(micro_batch, int) or not block_size:
        return None, budget
    return plain_logits_bytes(micro_batch * block_size, layer.weight.shape[0]), budget


def install_output_loss(model: nn.Module, eff: EfficiencyConfig, device: torch.device, micro_batch: int | str | None,
                        block_size: int | None, uniform: bool) -> OutputLossNote | None:
    """``efficiency.chunked_loss`` on ``model`` as a run on ``device`` with this micro-batch chooses it (the sizes of
    :func:`output_loss_sizes`; ``micro_batch`` None: not known, as for ``leantrain eval``): the connector's output loss
    converter for every command, so that plan prices what train installs; a note for the log."""
    return apply_chunked_loss(model, eff.chunked_loss, device.type,
                              *output_loss_sizes(model, eff, device, micro_batch, block_size), uniform=uniform)


def choose_recast(requested: str | bool, device_type: str, precision: str, strategy: str, compiled: bool,
                  checkpointing: bool) -> tuple[bool, str]:
    """(make the linear layers' weight casts again in the backward?, why) for ``efficiency.recast_weights``
    (:mod:`leantrain.modeling.weight_casts`). Never where the backward's weight is not the forward's (FSDP and
    DeepSpeed free the gathered weights after the forward), under compile, or under gradient checkpointing (its
    blocks keep nothing to save); nothing to do without a lower-precision autocast."""
    if requested is False:
        return False, "as configured (efficiency.recast_weights)"
    if precision not in ("bf16", "fp16"):
        return False, f"{precision}: no autocast casts of the weights"
    if strategy in ("fsdp", "deepspeed"):
        return False, f"{strategy} gathers the weights for the forward and frees them after it"
    if compiled:
        return False, "not under torch.compile"
    if checkpointing:
        return False, "gradient checkpointing keeps no activations of its blocks"
    if requested is True:
        return True, "as configured (efficiency.recast_weights)"
    if device_type != "cpu":
        return False, f"auto: not measured on {device_type} yet"
    return True, "auto: on for CPU training (benchmarks/results/grpo.md)"


def choose_compile(requested: str | bool, device_type: str, language_model: bool, strategy: str) -> tuple[bool, str]:
    """(compile the model?, why) for ``efficiency.compile``; ``language_model``: the task trains on token blocks
    (causal LMs); ``strategy``: ``distributed.strategy``.

    ``auto`` is off everywhere today: on the CPU a compile gave no gain (benchmarks/results/efficiency.md: ~45 s cold, forward 69
    against 68.5 ms eager); on CUDA nobody has measured it yet. ``benchmarks/gpu/check.sh`` measures compile on/off
    for a GPT-2-small-sized Llama on the GPU: where it pays, the CUDA language-model branch below turns on."""
    if isinstance(requested, bool):
        return requested, "as configured (efficiency.compile)"
    if device_type == "cpu":
        return False, "auto: a compile gave no gain on the CPU (benchmarks/results/efficiency.md)"
    if device_type != "cuda":
        return False, f"auto: not measured on {device_type}"
    if strategy == "deepspeed":
        return False, "auto: DeepSpeed's ZeRO hooks would be bypassed by a graph compiled before them"
    if not language_model:
        return False, "auto: on CUDA only causal-LM training is a candidate, and it is not measured yet"
    return False, ("auto: not measured on CUDA yet (benchmarks/gpu/check.sh measures compile on/off); "
                   "efficiency.compile=true to try it")


@dataclass(frozen=True)
class ModelChoices:
    """What ``model.attn_implementation``, ``efficiency.compile`` and ``efficiency.recast_weights`` resolved to in
    this run, and why."""

    attention: str | None  # None: transformers' default (a model class not known before its code loads)
    attention_reason: str
    compile: bool
    compile_reason: str
    recast: bool  # efficiency.recast_weights, resolved (choose_recast)
    recast_reason: str

    def summary(self) -> dict:
        """summary.json's efficiency entries for the choices."""
        return {"attn_implementation_reason": self.attention_reason, "compile_applied": self.compile,
                "compile_reason": self.compile_reason, "recast_weights_applied": self.recast,
                "recast_weights_reason": self.recast_reason}


def resolve_model_choices(cfg: Config, task: Task, device_type: str, precision: str) -> ModelChoices:
    """The attention implementation (:func:`leantrain.modeling.attention.choose_attention`, from the model class
    ``task`` builds for the model's config), compile (:func:`choose_compile`) and the weight casts
    (:func:`choose_recast`) of a run on ``device_type`` in the resolved ``precision``. Raises ConfigError for an
    explicit attention the model, device or precision cannot run."""
    support = attention_support(task.model.auto_class(), load_config(cfg.model))
    attention, why = choose_attention(cfg.model.attn_implementation, device_type, precision, flash_attn_usable(),
                                      support, fp32_uses(cfg))
    compiled, compile_why = choose_compile(cfg.efficiency.compile, device_type, task.traits.token_blocks,
                                           cfg.distributed.strategy)
    eff = cfg.efficiency
    recast, recast_why = choose_recast(eff.recast_weights, device_type, precision, cfg.distributed.strategy, compiled,
                                       eff.gradient_checkpointing)
    return ModelChoices(attention, why, compiled, compile_why, recast, recast_why)


def compile_seconds() -> float | None:
    """Total time torch.compile (dynamo + backend) spent in this process, or None if nothing was compiled."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return None
    spent = compilation_time_metrics.get("_compile.compile_inner") or []
    return float(sum(spent)) if spent else None
