"""QLoRA (``peft.method=qlora``): LoRA adapters over a pretrained base loaded 4-bit through bitsandbytes, on CUDA.

- Where it runs: a CUDA device with bitsandbytes installed and bf16 (the 4-bit layers compute in bf16). Elsewhere
  ``check_qlora`` refuses before any worker or model starts (exit 2, the reason, ``peft.method=lora`` instead).
- Loading (``load_kwargs``): ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
  bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)``, the other weights bf16, the whole model
  on the local process's GPU (``device_map={"": local_process_index}``, as Accelerate requires for a 4-bit model).
- Training (``prepare``): ``peft.prepare_model_for_kbit_training`` (freezes the base, casts its non-4-bit weights to
  fp32, gradient checkpointing as the run sets it), then the same LoRA as ``peft.method=lora``.
- Checkpoints (``leantrain.modeling.trainable_state``, as for LoRA): the 4-bit base is frozen and rebuilt from the
  pretrained weights on resume, so a checkpoint holds the trainable tensors only (adapters + a classifier's head).
- Saving (``merged_full_precision``): the merged ``model/`` is built on CPU from the base reloaded in bf16 (not 4-bit)
  plus the saved adapter folder, merged with ``merge_and_unload``: a plain model without peft or bitsandbytes.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from torch import nn

from leantrain.config import Config
from leantrain.errors import ConfigError, UserError
from leantrain.modeling.load import build_model
from leantrain.modeling.peft_import import import_peft, peft_quiet

log = logging.getLogger("leantrain")

QUANTIZATION = {"library": "bitsandbytes", "bits": 4, "quant_type": "nf4", "double_quant": True,
                "compute_dtype": "bfloat16"}
ALTERNATIVE = "Use peft.method=lora (efficiency.precision=bf16 for a smaller footprint)"
CPU_REASON = (
    "on CPU, bitsandbytes 0.50's CPU backend runs a lone 4-bit Linear, but a model loaded 4-bit through transformers "
    "(BitsAndBytesConfig) is left with an uninitialised quantisation state and its first forward fails inside "
    "bitsandbytes, and layers narrower than the 64-value quantisation block fail to pack")
BNB_INSTALL = "pip install bitsandbytes"


def refusal(device: str) -> str:
    """Why ``peft.method=qlora`` cannot run on ``device`` (anything but cuda)."""
    why = CPU_REASON if device == "cpu" else f"bitsandbytes' 4-bit training is wired for CUDA only, not {device}"
    return (f"peft.method=qlora (LoRA over 4-bit base weights) needs a CUDA device; this run's device is {device}: "
            f"{why}. {ALTERNATIVE}")


def check_qlora(cfg: Config, device: str, precision: str | None = None) -> None:
    """Exit 2 before any worker or model starts when ``peft.method=qlora`` cannot run here: not CUDA, bitsandbytes
    missing, or a resolved precision other than bf16 (``precision``: what ``efficiency.precision`` resolved to)."""
    if cfg.peft.method != "qlora":
        return
    if device != "cuda":
        raise ConfigError(refusal(device))
    if importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(f"peft.method=qlora needs bitsandbytes, which is not installed: {BNB_INSTALL}")
    if precision is not None:
        check_qlora_precision(cfg, precision)


def check_qlora_precision(cfg: Config, precision: str) -> None:
    """``peft.method=qlora`` computes in bf16: exit 2 when ``efficiency.precision`` resolves to anything else here
    (the check the run makes once it knows its precision; ``check_qlora`` checked the device before)."""
    if cfg.peft.method == "qlora" and precision != "bf16":
        raise ConfigError(f"peft.method=qlora: efficiency.precision resolves to {precision} here, but the 4-bit "
                          "layers compute in bf16 (bnb_4bit_compute_dtype=bfloat16); this GPU needs bf16 support. "
                          f"{ALTERNATIVE}")


def is_quantized(model: nn.Module) -> bool:
    """A model with 4-bit base weights (transformers' ``is_loaded_in_4bit``, or any bitsandbytes ``Params4bit``)."""
    return bool(getattr(model, "is_loaded_in_4bit", False)) or any(
        type(p).__name__ == "Params4bit" for p in model.parameters())


def load_kwargs(method: str, local_process_index: int) -> dict:
    """The ``from_pretrained`` keywords of a QLoRA run (empty for any other method)."""
    if method != "qlora":
        return {}
    import torch
    from transformers import BitsAndBytesConfig

    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=QUANTIZATION["quant_type"],
                             bnb_4bit_use_double_quant=QUANTIZATION["double_quant"],
                             bnb_4bit_compute_dtype=torch.bfloat16)
    return {"quantization_config": bnb, "dtype": torch.bfloat16, "device_map": {"": local_process_index}}


def prepare(model: nn.Module, gradient_checkpointing: bool) -> nn.Module:
    """peft's ``prepare_model_for_kbit_training`` on a 4-bit model (exit 2 for a model that is not 4-bit, e.g. in
    ``leantrain plan``, which does not price 4-bit weights)."""
    if not is_quantized(model):
        raise ConfigError("peft.method=qlora needs the base loaded 4-bit (leantrain train does so on CUDA); "
                          "leantrain plan does not price 4-bit base weights yet: plan with peft.method=lora for an "
                          "upper bound")

    peft = import_peft("qlora")
    return peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})


def record() -> dict:
    """summary.json's ``model.peft.quantization``."""
    out = dict(QUANTIZATION)
    try:
        import bitsandbytes  # lazy: optional, CUDA runs only

        out["bitsandbytes_version"] = bitsandbytes.__version__
    except ImportError:
        pass
    return out


# ------------------------------------------------------------------------------------------------------ saving


def merged_full_precision(cfg: Config, label_names: list[str], task, adapter_dir: Path,
                          config_fields: dict | None = None) -> nn.Module:
    """The merged model of a QLoRA run: the base reloaded bf16 on CPU (not 4-bit), the adapter folder loaded onto
    it, ``merge_and_unload``: a plain transformers model that loads without peft or bitsandbytes. Costs one more
    load of the base (2 bytes per parameter of host memory) and the merge on CPU, at the end of the run."""
    import torch


    base = build_model(cfg.model, label_names, task, extra={"dtype": torch.bfloat16})
    if config_fields:
        base.config.update(config_fields)
    with peft_quiet():
        merged = import_peft("qlora").PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    return merged
