"""Which attention implementation a run's model is built with (``model.attn_implementation``), handed to
transformers' ``attn_implementation`` when the model is loaded or built from its config.

:func:`choose_attention` is the whole decision, a pure function of the device, the precision, whether the
``flash_attn`` package is usable and what the model class supports (:class:`AttentionSupport`):

- ``flash_attention_2``: CUDA, bf16 or fp16, ``flash_attn`` usable (transformers' own check), a model class that
  supports it, and no pass of the run outside autocast (``fp32_uses``: report.sample_prompts' generation and the
  LoRA merge check run the fp32 model as it is, which flash-attn cannot compute). Not measured against SDPA on a
  GPU yet (``benchmarks/gpu/check.sh`` measures it); flash-attn is no dependency of leantrain, so ``auto`` picks it
  only where the user installed it;
- ``leantrain_sdpa``: a CPU run in bf16 / fp16 whose class supports SDPA: SDPA, with the backward of short rows
  computed with matmuls in fp32, where PyTorch's CPU flash backward is several times slower in half precision
  (``leantrain.modeling.short_attention``; the same forward, gradients as close to exact as SDPA's own);
- ``sdpa``: PyTorch's ``scaled_dot_product_attention`` where the class supports it: transformers' own default, so a
  run in fp32 or on a GPU without flash-attn builds the same model as before the key existed;
- ``eager``: the class's own matmul-softmax attention, where it has no SDPA (or no attention at all: ConvNeXt, ResNet).

An explicit value is checked the same way: one the model class, the device or the precision cannot run exits 2
(ConfigError) naming the key, before any weight loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from leantrain.errors import ConfigError
from leantrain.modeling.short_attention import MAX_SIDE, NAME as SHORT_SDPA

HALF_PRECISIONS = ("bf16", "fp16")  # flash-attn computes in these only


@dataclass(frozen=True)
class AttentionSupport:
    """What a model class offers: its name, SDPA (``_supports_sdpa``) and flash attention (``_supports_flash_attn``)."""

    model_class: str
    sdpa: bool
    flash: bool


def attention_support(auto, config) -> AttentionSupport | None:  # noqa: ANN001 - an AutoModelFor..., a config
    """What the class ``auto`` builds for ``config`` supports; None when that class is not known before its code
    loads (a model with remote code): transformers then decides as it does by default."""
    try:
        cls = auto._model_mapping[type(config)]
    except (KeyError, AttributeError):
        return None
    return AttentionSupport(cls.__name__, bool(getattr(cls, "_supports_sdpa", False)),
                            bool(getattr(cls, "_supports_flash_attn", False)))


def flash_attn_usable() -> bool:
    """The ``flash_attn`` package is installed and usable on this machine (transformers' check: CUDA, version)."""
    from transformers.utils import is_flash_attn_2_available

    return bool(is_flash_attn_2_available())


def fp32_uses(cfg) -> tuple[str, ...]:  # noqa: ANN001 - leantrain Config
    """The settings of ``cfg`` whose passes run the fp32 model outside the prepared model's autocast."""
    uses = ("report.sample_prompts",) if cfg.report.sample_prompts else ()
    return uses + (("peft.method=lora (the merge check)",) if cfg.peft.method == "lora" and cfg.peft.merge else ())


def _flash_missing(device_type: str, precision: str, flash_installed: bool, support: AttentionSupport | None,
                   fp32_uses: tuple[str, ...]) -> str:
    """What keeps flash attention from running here ("" when nothing does)."""
    if device_type != "cuda":
        return f"flash attention runs on CUDA only, this run on {device_type}"
    if precision not in HALF_PRECISIONS:
        return f"flash attention computes in bf16 / fp16 only, this run in {precision}"
    if not flash_installed:
        return "the flash_attn package is not installed: pip install flash-attn"
    if support is not None and not support.flash:
        return f"{support.model_class} has no flash-attention implementation in transformers"
    if fp32_uses:
        return f"{', '.join(fp32_uses)} run the fp32 model outside autocast, which flash attention cannot compute"
    return ""


def choose_attention(requested: str, device_type: str, precision: str, flash_installed: bool,
                     support: AttentionSupport | None, fp32_uses: tuple[str, ...] = ()) -> tuple[str | None, str]:
    """(the ``attn_implementation`` to build the model with, why) for ``model.attn_implementation``. ``precision``:
    the run's resolved precision; ``flash_installed``: :func:`flash_attn_usable`; ``support``:
    :func:`attention_support` (None: not known, and ``auto`` leaves the choice to transformers: None);
    ``fp32_uses``: the settings whose passes run the model outside autocast (:func:`fp32_uses`).
    Raises ConfigError for an explicit value that cannot run here."""
    key = f"model.attn_implementation={requested}"
    if requested == "eager":
        return "eager", "as configured"
    if requested == "sdpa":
        if support is not None and not support.sdpa:
            raise ConfigError(f"{key}: {support.model_class} has no SDPA implementation in transformers; use "
                              "model.attn_implementation=eager or auto")
        return "sdpa", "as configured"
    flash_missing = _flash_missing(device_type, precision, flash_installed, support, fp32_uses)
    if requested == "flash_attention_2":
        if flash_missing:
            raise ConfigError(f"{key}: {flash_missing}; use model.attn_implementation=sdpa or auto")
        return "flash_attention_2", "as configured"
    if support is None:
        return None, "transformers' default (the model's class is not known before its code loads)"
    if not flash_missing:
        return "flash_attention_2", (f"auto: CUDA in {precision} with flash_attn installed, and {support.model_class} "
                                     "supports it")
    if support.sdpa and device_type == "cpu" and precision in HALF_PRECISIONS:
        return SHORT_SDPA, (f"auto: PyTorch SDPA, the backward of rows of at most {MAX_SIDE} x {MAX_SIDE} scores a "
                            f"head as matmuls in fp32 (the CPU flash backward is slow in {precision}; calls with "
                            f"attention dropout keep SDPA's); not flash attention: {flash_missing}")
    if support.sdpa:
        return "sdpa", f"auto: PyTorch SDPA; not flash attention: {flash_missing}"
    return "eager", f"auto: {support.model_class} has no SDPA implementation in transformers"
