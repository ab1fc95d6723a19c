"""Checks made before any work (before a worker process starts, a model loads or data is tokenised), each failing
with a UserError (exit status 2) that names the key or option and the value: what the model's position limit
allows for ``data.max_length``, whether ``output_dir`` / ``--output`` can be written, that a model folder has
weights leantrain will load, and that an explicit ``model.attn_implementation`` can run.
See docs/exit-codes.md."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

from leantrain.engine.devices.accelerator import device_type
from leantrain.engine.devices.batch_layout import batch_layout
from leantrain.engine.devices.efficiency import resolve_model_choices, resolve_precision
from leantrain.engine.evaluation.harness import check_harness
from leantrain.errors import ConfigError, UserError
from leantrain.units import format_bytes
from leantrain.modeling import load_config
from leantrain.modeling.from_scratch import check_config_overrides
from leantrain.modeling.load import meta_model
from leantrain.modeling.lora import check_rank, lora_parameters, lora_targets
from leantrain.modeling.positions import model_position_limit
from leantrain.modeling.qlora import check_qlora
from leantrain.methods import Task, resolve_task

log = logging.getLogger("leantrain")

# Where a config keeps its position limit, in the order transformers' configs use them.
def check_max_length(cfg, task: Task | None = None, config=None):  # noqa: ANN001 - leantrain Config, transformers config
    """``cfg`` with ``data.max_length`` within the model's position limit (text models only); ``task``: the run's
    (unset: what the model's config says).

    Set explicitly above the limit: ConfigError naming both numbers (``data.block_size`` too, for a task whose rows
    are cut at it, and ``data.max_length`` set above the limit whatever the task: a reward model's MiniLM takes 512).
    Left at its default above a small model's limit: lowered to the limit, with a log note. Returns the (possibly
    updated) config."""
    task = task or resolve_task(cfg)
    if not task.traits.tokenized:  # a position limit is in tokens
        return cfg
    found = model_position_limit(cfg, config)
    if found is None:
        return cfg
    limit, source = found
    if task.traits.token_blocks:  # language models, preference pairs: the rows are cut at data.block_size tokens
        cfg = _check_block_size(cfg, limit, source)
        if "max_length" not in cfg.data.model_fields_set:  # then only a data.max_length set above the limit says more
            return cfg
    asked = cfg.data.max_length
    if asked <= limit:
        return cfg
    if "max_length" in cfg.data.model_fields_set:
        raise ConfigError(
            f"data.max_length={asked} is more than the model takes: its config has {source}, so at most {limit} "
            f"tokens per example; set data.max_length={limit} or less")
    if os.environ.get("RANK", "0") == "0":
        print(f"leantrain: note: data.max_length: {limit} tokens per example, the model's limit ({source}); the "
              f"default {asked} is more than it takes", file=sys.stderr)
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"max_length": limit})})


def _check_block_size(cfg, limit: int, source: str):  # noqa: ANN001, ANN202 - leantrain Config
    """``data.block_size`` within the model's position limit: set above it, exit 2 naming both numbers; left at its
    default (512) above a small model's limit, lowered to the limit with a note."""
    asked = cfg.data.block_size
    if asked <= limit:
        return cfg
    if "block_size" in cfg.data.model_fields_set:
        raise ConfigError(f"data.block_size={asked} is more than the model takes: its config has {source}, so at most "
                          f"{limit} tokens per block; set data.block_size={limit} or less")
    if os.environ.get("RANK", "0") == "0":
        print(f"leantrain: note: data.block_size: {limit} tokens per block, the model's limit ({source}); the default "
              f"{asked} is more than it takes", file=sys.stderr)
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"block_size": limit})})


def check_model_plan(cfg, task: Task, config=None) -> None:  # noqa: ANN001 - leantrain Config, transformers config
    """Before any weight loads, on the model of ``task`` built on the meta device (``meta_model``):
    ``model.config_overrides`` through the number checks, LoRA's target modules and rank (``peft.*``), and the memory
    the weights and gradients need at the least, against this machine's (exit 2 naming the keys)."""
    config = config if config is not None else load_config(cfg.model)
    check_config_overrides(config, cfg.model.config_overrides)
    task.model.check_architecture(cfg, config)  # a causal LM's needs a decoder
    model = meta_model(cfg.model, task, config)
    if model is None:
        return
    total = sum(p.numel() for p in model.parameters())
    trainable = total
    if cfg.peft.method != "none":
        targets, _ = lora_targets(model, cfg.peft)
        check_rank(model, targets, cfg.peft.r)
        trainable = lora_parameters(model, targets, cfg.peft.r)
    check_planned_memory(cfg, total, trainable)


def check_planned_memory(cfg, total: int, trainable: int) -> None:  # noqa: ANN001 - leantrain Config
    """Weights (fp32; QLoRA's base 4-bit) and the gradients of the trainable parameters (any optimizer's state and
    the activations come on top): exit 2 when that alone is more than the machine's memory (the GPU's, else the
    RAM). Skipped when FSDP / DeepSpeed shard it."""
    if cfg.distributed.strategy in ("fsdp", "deepspeed"):
        return
    base = total * (0.5 if cfg.peft.method == "qlora" else 4)
    planned = int(base + trainable * (4 + 4 if cfg.peft.method != "none" else 4))  # LoRA: its weights + gradients
    if device_type() == "cuda":
        import torch

        budget, where = torch.cuda.get_device_properties(0).total_memory, "the GPU's memory"
    else:
        import psutil

        budget, where = psutil.virtual_memory().total, "this machine's RAM"
    if planned > budget:
        keys = "peft.r, peft.target_modules" if cfg.peft.method != "none" else "the model (model.name / config_overrides)"
        raise ConfigError(f"the model needs at least {format_bytes(planned)} for its weights and gradients alone "
                          f"({total:,} parameters, {trainable:,} trained), more than {where} "
                          f"({format_bytes(budget)}); choose a smaller {keys}")


def check_attention(cfg, task: Task) -> None:  # noqa: ANN001 - leantrain Config
    """An explicit ``model.attn_implementation`` the model class of ``task``, the device or the precision cannot run:
    exit 2 before any model loads (``auto`` always finds one)."""
    if cfg.model.attn_implementation != "auto":
        precision = resolve_precision(cfg.efficiency.precision, device_type())[0]
        resolve_model_choices(cfg, task, device_type(), precision)


def _nearest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path(".")


def check_writable_dir(path: str | Path, what: str) -> None:
    """``what`` (e.g. 'output_dir=runs/x') names a folder that exists or can be created, and can be written."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise UserError(f"{what}: {p} exists and is not a folder; choose another output_dir (or remove the file)")
    base = _nearest_existing(p.absolute())
    if not base.is_dir():
        raise UserError(f"{what}: {base} is a file, so the folder {p} cannot be created")
    try:  # the only reliable test (root passes os.access on /proc and /sys): create and remove a folder there
        probe = tempfile.mkdtemp(prefix=".leantrain-probe-", dir=base)
        os.rmdir(probe)
    except OSError as e:
        raise UserError(f"{what}: cannot write in {base} ({e.strerror or e}); choose a folder you can write to"
                        ) from None


def check_output_file(path: str | Path, option: str, example: str = "predictions.jsonl") -> None:
    """A file to be written (``predict --output``): not a folder, and its folder writable."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise UserError(f"{option} {path}: is a folder; give a file name in it, e.g. {p / example}")
    check_writable_dir(p.parent if str(p.parent) else ".", f"{option} {path}")


def check_weights(folder: str, allow_pickle: bool, key: str = "model") -> None:
    """A local model folder holding only pickle weights (*.bin, *.pt) is refused unless allowed."""
    p = Path(folder)
    if allow_pickle or not p.is_dir():
        return
    if any(p.glob("*.safetensors")) or any(p.glob("*.safetensors.index.json")):
        return
    pickled = sorted(f.name for f in p.iterdir() if f.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    if pickled:
        raise UserError(
            f"{key} {folder}: only pickle weights ({', '.join(pickled[:3])}); leantrain refuses pickle files by "
            "default because loading them can run code. If you trust the source, set model.allow_pickle=true")
    raise UserError(f"{key} {folder}: no model weights (*.safetensors) in this folder")


def check_train(cfg, task: Task | None = None, data=None, world_size: int = 1, device: str | None = None) -> None:  # noqa: ANN001
    """What the model and the output folder need, checked before a worker or model starts (``cfg`` as
    ``check_max_length`` returned it): QLoRA on this ``device``, output_dir writable, the model's plan (overrides,
    LoRA, memory); ``task``: the run's (unset: what the model's config says). ``data`` (loaded and checked) adds the
    batch arithmetic over ``world_size`` processes."""
    task = task or resolve_task(cfg)
    check_qlora(cfg, device or device_type())  # peft.method=qlora on a device without bitsandbytes' 4-bit training
    if cfg.output_dir is not None:
        check_writable_dir(cfg.output_dir, f"output_dir={cfg.output_dir}")
    else:
        check_writable_dir("runs", "output_dir (unset: runs/<date-time>)")
    check_model_plan(cfg, task)
    check_attention(cfg, task)
    check_harness(cfg.eval, task)  # eval.harness_tasks: defined and loadable, before any training
    if data is not None and world_size > 1 and hasattr(data.train, "__len__"):  # batch arithmetic over the
        # processes (rows known: not for token blocks, cut after tokenising)
        batch_layout(cfg, len(data.train), world_size)
