"""What a run leaves behind: config.yaml, model/ (save_pretrained + processor + model card), summary.json,
loss_curve.png. Rank 0 writes; every rank contributes its peak memory."""

from __future__ import annotations

import logging
import math
import platform
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn

from leantrain.config import Config
from leantrain.engine.batch_layout import BatchLayout
from leantrain.engine.distributed import full_state_dict
from leantrain.engine.dropout import resolve_dropout
from leantrain.engine.efficiency import compile_seconds
from leantrain.engine.training_data import TrainingData
from leantrain.modeling.lora import is_peft_model, merged_for_saving, save_adapter, save_adapter_only
from leantrain.modeling.names import display_name
from leantrain.modeling.qlora import is_quantized, merged_full_precision
from leantrain.modeling.tasks.class_weights import class_weights_record
from leantrain.perf.memory import device_memory, peak_rss_bytes
from leantrain.perf.meter import Throughput
from leantrain.report.card import write_model_card
from leantrain.report.logs import write_json
from leantrain.engine.run_settings import write_run_settings
from leantrain.report.plots import plot_loss_curve, short_model_name
from leantrain.version import __version__

log = logging.getLogger("leantrain")


def versions() -> dict[str, str]:
    import accelerate
    import datasets
    import transformers

    return {"leantrain": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "accelerate": accelerate.__version__, "datasets": datasets.__version__}


def peak_memory(accelerator: Accelerator) -> dict[str, int]:
    """The largest peak over all processes (a collective: every rank must call it)."""
    mine = torch.tensor([peak_rss_bytes(), *device_memory(accelerator.device).values()], dtype=torch.float64,
                        device=accelerator.device)
    peak = accelerator.reduce(mine, reduction="max") if accelerator.num_processes > 1 else mine
    keys = ["peak_memory_bytes", *device_memory(accelerator.device).keys()]
    return {k: int(v) for k, v in zip(keys, peak.tolist())}


@dataclass
class RunResult:
    """What a finished run reports; summary.json is assembled from it alone (``build_summary``)."""

    layout: BatchLayout
    meter: Throughput
    steps: int  # optimizer steps of the whole run (a resumed run counts those before the resume too)
    last_eval: dict | None
    records: list[dict]  # metrics.jsonl
    wall_seconds: float
    counts: dict[str, int]  # parameter counts
    optim_state: dict | None
    speed: dict  # MFU and the time split, for the summary's train section
    efficiency: dict
    distributed: dict
    resumed_from_step: int | None
    skipped_steps: list[int]
    best: dict
    trainable: dict | None = None  # peft / freeze record (modeling.lora.Trainable.record)


def efficiency_summary(eff, accelerator: Accelerator, model: nn.Module, precision: str, precision_reason: str,
                       allocator) -> dict:
    """summary.json's ``efficiency`` section: the settings as configured, and what they resolved to in this run
    (``precision`` and why, the CPU allocator, dropout, the attention implementation, compile time)."""
    return {**eff.model_dump(), "precision_requested": eff.precision, "precision": precision,
            "precision_reason": precision_reason, "cpu_allocator_applied": allocator,
            "dropout_applied": resolve_dropout(eff.dropout, accelerator.device.type),
            "attn_implementation": accelerator.unwrap_model(model).config._attn_implementation,
            "compile_seconds": compile_seconds() if eff.compile else None}


def build_summary(cfg: Config, accelerator: Accelerator, model: nn.Module, data: TrainingData, result: RunResult,
                  memory: dict[str, int]) -> dict:
    """summary.json, in one place. ``memory``: the peak over all processes (``peak_memory``)."""
    meter, layout = result.meter, result.layout
    return {
        "output_dir": str(Path(cfg.output_dir)),
        "eval": result.last_eval,
        "train": {
            "steps": result.steps,
            "epochs": round(result.steps / layout.steps_per_epoch, 4),
            "samples": meter.all_samples,
            "samples_per_second": meter.samples_per_second,
            "tokens_per_second": meter.tokens_per_second,
            "tokens_seen": meter.all_tokens if meter.counts_tokens else None,  # what tokens/s counts, this run's
            "measured_steps": meter.measured_steps,
            "warmup_steps_excluded": min(meter.skip, meter.steps) if meter.steps > meter.skip else 0,
            "loop_seconds": meter.all_time,
            "wall_seconds": result.wall_seconds,
            "batch_size": layout.batch_size,
            "micro_batch_size": layout.micro_batch_size,
            "accumulation_steps": layout.accum,
            "final_loss": next((r["loss"] for r in reversed(result.records) if r.get("type") == "train"), None),
            **memory,
            **result.speed,
            "resumed_from_step": result.resumed_from_step,
            "skipped_steps": result.skipped_steps,
            "class_weights": class_weights_record(data.class_weights, data.label_names),  # None: unweighted
            **data.task_object.summary(data.label_names),  # multi-label: pos_weight
        },
        "efficiency": result.efficiency,
        "model": {"name": data.model_name, "class": type(accelerator.unwrap_model(model)).__name__,
                  "parameters": result.counts, "labels": data.label_names,
                  "trainable_parameters": result.counts["trainable"], "total_parameters": result.counts["total"],
                  **({"peft": result.trainable} if result.trainable else {})},
        "optim": result.optim_state or {"name": cfg.optim.name},
        "data": {"train_rows": len(data.train), "eval_rows": len(data.eval), "columns": data.columns},
        "distributed": result.distributed,
        "device": {"type": accelerator.device.type, "name": _device_name(accelerator.device),
                   "threads": torch.get_num_threads()},
        "versions": versions(),
        "best": result.best,
    }


def save_outputs(cfg: Config, accelerator: Accelerator, model: nn.Module, data: TrainingData,
                 result: RunResult) -> dict:
    """Gather the weights and the peak memory (collectives: every rank calls it); rank 0 writes config.yaml,
    model/, summary.json and the report files. Returns the summary."""
    out = Path(cfg.output_dir)
    memory = peak_memory(accelerator)
    state_dict = full_state_dict(model)  # gathered from the shards under FSDP (every rank takes part)
    accelerator.wait_for_everyone()
    summary = build_summary(cfg, accelerator, model, data, result, memory)
    if accelerator.is_main_process:
        (out / "config.yaml").write_text(cfg.to_yaml())
        saved = data.task_object.saved_config(summary["eval"])
        accelerator.unwrap_model(model).config.update(saved)
        model_dir = _save_model(cfg, accelerator.unwrap_model(model), out, state_dict, data)
        data.processor.save_pretrained(model_dir)  # tokenizer / preprocessor_config.json: pipeline() loads it
        write_run_settings(model_dir, cfg, data.task, data.columns, saved)  # predict / eval default to them
        write_json(out / "summary.json", summary)
        _report_files(cfg, out, model_dir, data, summary, result.records)
        log.info("saved %s (model/, summary.json, metrics.jsonl, config.yaml)", out)
        ev = summary["eval"]
        if ev:
            log.info("%s, loss %.4f on %d examples", data.task_object.headline(ev), ev.get("loss", math.nan),
                     ev["samples"])
    accelerator.wait_for_everyone()
    return summary


def _save_model(cfg: Config, model: nn.Module, out: Path, state_dict: dict | None, data: TrainingData) -> Path:
    """model/ (save_pretrained). A LoRA run: the adapter in adapter/ and, with peft.merge (default), the merged
    model in model/ (loads without peft); else the adapter folder is the run's model folder. Returns that folder.
    QLoRA: the merged model is the base reloaded bf16 on CPU with the adapter merged (no 4-bit weights saved)."""
    processor = data.processor
    if not is_peft_model(model):
        model.save_pretrained(out / "model", state_dict=state_dict, safe_serialization=True)
        return out / "model"
    if not cfg.peft.merge:
        log.info(save_adapter_only(model, out / "adapter"))
        processor.save_pretrained(out / "adapter")
        return out / "adapter"
    save_adapter(model, out / "adapter")
    if is_quantized(model):
        log.info("QLoRA: merging the adapter into the base reloaded in bf16 on CPU (not 4-bit)")
        merged = merged_full_precision(cfg, data.label_names, data.task, out / "adapter",
                                       data.task_object.saved_config(None))
    else:
        merged = merged_for_saving(model)
    merged.save_pretrained(out / "model", safe_serialization=True)
    log.info("LoRA: adapter in %s, merged model in %s (loads without peft)", out / "adapter", out / "model")
    return out / "model"


def _report_files(cfg: Config, out: Path, model_dir: Path, data: TrainingData, summary: dict, records: list) -> None:
    base = data.model_name if cfg.model.config or cfg.model.config_type else display_name(cfg.model.name)
    write_model_card(model_dir, base_model=base, label_names=data.label_names, summary=summary,
                     config=cfg.to_dict(), task=data.task)
    if cfg.report.plots:
        plot_loss_curve(records, out / "loss_curve.png", title=f"{short_model_name(data.model_name)} — {out.name}")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()
