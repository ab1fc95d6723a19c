"""What a run leaves behind: config.yaml, model/ (save_pretrained + processor + model card), summary.json,
loss_curve.png. Rank 0 writes; every rank contributes its peak memory."""

from __future__ import annotations

import logging
import math
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import extract_model_from_parallel
from torch import nn

from leantrain.config import Config
from leantrain.data.loaders import to_device
from leantrain.engine.devices.batch_layout import BatchLayout
from leantrain.engine.checkpoint.save import complete_checkpoints
from leantrain.engine.devices.distributed import full_state_dict
from leantrain.engine.devices.dropout import resolve_dropout
from leantrain.engine.devices.efficiency import ModelChoices, compile_seconds
from leantrain.engine.training.faults import FaultInjector
from leantrain.engine.evaluation.harness import harness_of_folder
from leantrain.engine.setup.training_data import TrainingData
from leantrain.errors import UserError
from leantrain.files import disk_full, disk_of, staged_folders
from leantrain.modeling.load import save_dtype
from leantrain.modeling.lora import is_peft_model, merged_for_saving, save_adapter, save_adapter_only
from leantrain.modeling.names import display_name
from leantrain.modeling.qlora import is_quantized, merged_full_precision
from leantrain.perf.memory import device_memory, peak_rss_bytes
from leantrain.perf.meter import Throughput
from leantrain.report.card import write_model_card
from leantrain.report.logs import write_json
from leantrain.engine.setup.run_settings import cut_like_training, write_run_settings
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
    paths: dict | None = None  # the record of fast paths: {name: {"value", "reason"}} (engine/devices/paths.py)


def efficiency_summary(eff, accelerator: Accelerator, model: nn.Module, precision: str, precision_reason: str,
                       allocator, choices: ModelChoices) -> dict:
    """summary.json's ``efficiency`` section: the settings as configured, and what they resolved to in this run
    (``precision`` and why, the CPU allocator, dropout, the attention implementation and compile and why, compile
    time)."""
    return {**eff.model_dump(), "precision_requested": eff.precision, "precision": precision,
            "precision_reason": precision_reason, "cpu_allocator_applied": allocator,
            "dropout_applied": resolve_dropout(eff.dropout, accelerator.device.type),
            "attn_implementation": accelerator.unwrap_model(model).config._attn_implementation, **choices.summary(),
            "compile_seconds": compile_seconds() if choices.compile else None}


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
            "speed_unit": data.task.traits.speed_unit,  # what the final line shows: the task declares it
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
            **data.task.report.summary(data.label_names),  # classification: class_weights; multi-label: pos_weight
        },
        "efficiency": result.efficiency,
        "paths": result.paths,  # what each fast path chose, and why (engine/devices/connector.py)
        "model": {"name": data.model_name, "class": type(accelerator.unwrap_model(model)).__name__,
                  "parameters": result.counts, "labels": data.label_names,
                  "trainable_parameters": result.counts["trainable"], "total_parameters": result.counts["total"],
                  **({"peft": result.trainable} if result.trainable else {})},
        "optim": result.optim_state or {"name": cfg.optim.name},
        "data": {"train_rows": len(data.train), "eval_rows": len(data.eval), "columns": data.columns,
                 **eval_rows(data)},
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
        try:
            _write_outputs(cfg, accelerator.unwrap_model(model), out, state_dict, data, summary, result.records)
        except Exception as e:
            if not disk_full(e):
                raise
            raise _disk_full_error(out) from None
        log.info("saved %s (model/, summary.json, metrics.jsonl, config.yaml)", out)
    accelerator.wait_for_everyone()
    return summary


def _write_outputs(cfg: Config, model: nn.Module, out: Path, state_dict: dict | None, data: TrainingData,
                   summary: dict, records: list) -> None:
    """config.yaml, model/ (weights, processor, run settings, card; with LoRA adapter/ too) written whole in a staging
    folder and moved in place (``leantrain.files.staged_folders``: never half-written, as the checkpoints),
    loss_curve.png, and summary.json LAST: a run killed before summary.json is written is not complete, and its
    rerun writes every file again."""
    (out / "config.yaml").write_text(cfg.to_yaml())
    saved = data.task.report.saved_config(summary["eval"])
    model.config.update(saved)
    with staged_folders(out) as stage:
        staged = _save_model(cfg, model, out, state_dict, data, stage)
        cut_like_training(data.processor, data.task, cfg)  # pipeline(truncation=True) cuts as the run did
        data.processor.save_pretrained(staged)  # tokenizer / preprocessor_config.json: pipeline() loads it
        FaultInjector(0).in_final_save()
        write_run_settings(staged, cfg, data.task, data.columns,  # predict / eval default to them
                           (summary.get("efficiency") or {}).get("precision"), saved,
                           data.eval_width(summary["train"]["micro_batch_size"]))
        if cfg.eval.harness_tasks:  # the saved model, as a user loads it (the card below shows the scores)
            summary["harness"], table = harness_of_folder(staged, cfg.eval.harness_tasks, cfg.eval.harness_dir)
            log.info("evaluation harness:\n%s", table)
        base = data.model_name if cfg.model.config or cfg.model.config_type else display_name(cfg.model.name)
        write_model_card(staged, base_model=base, label_names=data.label_names, summary=summary,
                         config=cfg.to_dict(), task=data.task, final_dir=out / staged.name)
    if cfg.report.plots:
        plot_loss_curve(records, out / "loss_curve.png", title=f"{short_model_name(data.model_name)} — {out.name}")
    write_json(out / "summary.json", summary)


def _disk_full_error(out: Path) -> UserError:
    """The final save ran out of space: nothing half-written stays (the staging folder goes with its error; a model/
    already moved in place goes too: a rerun writes it again); the newest checkpoint, kept until the model is saved,
    is where the rerun resumes."""
    shutil.rmtree(out / "model", ignore_errors=True)
    found = complete_checkpoints(out)
    kept = (f"the newest checkpoint ({found[0]}) and metrics.jsonl; run the same command again to resume from it"
            if found else "no checkpoint (none was written: checkpoint.every_steps); the training must be run again")
    return UserError(f"disk full while saving the trained model to {out / 'model'}; free some space on "
                     f"{disk_of(out)}. Kept: {kept}")


def eval_rows(data: TrainingData) -> dict:
    """What an eval row is: ``{"eval_row_kind": "examples"}``; a language model's token blocks: ``"blocks"``; packed
    instruction data: ``"blocks"`` and ``eval_examples`` (each example restarts its position_ids at 0)."""
    columns = getattr(data.eval, "column_names", None) or []
    if "position_ids" in columns:
        starts = sum(sum(1 for p in row if p == 0) for row in data.eval.with_format(None)["position_ids"])
        return {"eval_row_kind": "blocks", "eval_examples": int(starts)}
    blocks = data.task.traits.eval_row_kind == "blocks" and "format" not in (data.columns or {})  # text, cut
    return {"eval_row_kind": "blocks" if blocks else "examples"}


def _save_model(cfg: Config, model: nn.Module, out: Path, state_dict: dict | None, data: TrainingData,
                stage: Path) -> Path:
    """model/ (save_pretrained), written into ``stage`` (moved to ``out`` once whole). A LoRA run: the adapter in
    adapter/ and, with peft.merge (default), the merged model in model/ (loads without peft); else the adapter folder
    is the run's model folder. Returns that folder in ``stage``.
    QLoRA: the merged model is the base reloaded bf16 on CPU with the adapter merged (no 4-bit weights saved), saved
    in bf16 unless ``model.save_dtype=float32``."""
    processor = data.processor
    dtype = save_dtype(cfg.model)
    if not is_peft_model(model):
        model.to(dtype)  # the end of the run: nothing trains on (a sharded model's gathered state dict is cast)
        state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()} \
            if state_dict is not None else None
        model.save_pretrained(stage / "model", state_dict=state_dict, safe_serialization=True)
        _say_dtype(dtype)
        return stage / "model"
    if not cfg.peft.merge:
        log.info(save_adapter_only(model, stage / "adapter").replace(str(stage), str(out)))
        processor.save_pretrained(stage / "adapter")
        return stage / "adapter"
    save_adapter(model, stage / "adapter")
    if is_quantized(model):
        log.info("QLoRA: merging the adapter into the base reloaded in bf16 on CPU (not 4-bit)")
        merged = merged_full_precision(cfg, data.label_names, data.task, stage / "adapter",
                                       data.task.report.saved_config(None))
        dtype = torch.float32 if cfg.model.save_dtype == "float32" else torch.bfloat16  # its weights are bf16 values
    else:
        merged = _checked_merge(model, data)
    merged.to(dtype).save_pretrained(stage / "model", safe_serialization=True)
    _say_dtype(dtype)
    log.info("LoRA: adapter in %s, merged model in %s (loads without peft)", out / "adapter", out / "model")
    return stage / "model"


MERGE_CHECK_ROWS = 4  # eval rows (else training rows) both models compute the loss of
MERGE_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-4}  # relative; other weight dtypes (bf16, fp16): 1e-2


def _checked_merge(model: nn.Module, data: TrainingData) -> nn.Module:
    """The LoRA update merged into the base weights (``merged_for_saving``), checked: the merged model's loss on a
    few eval rows must be the adapter model's, else the run stops (exit 2) before writing model/ and says so (the
    adapter, already in adapter/, is the trained model). Both losses are taken in the weights' own precision: the
    autocast Accelerate put on the forward of a mixed-precision run is taken off first (the run is over), else the
    adapter model's loss would be a bf16 one against the merged model's fp32 one."""
    model = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    rows = data.eval if data.eval is not None and len(data.eval) else data.train
    n = min(MERGE_CHECK_ROWS, len(rows))
    collate = data.eval_collator or data.collator
    device = next(model.parameters()).device
    batch = to_device(collate([rows[i] for i in range(n)]), device)
    units = max(data.task.data.count(rows, list(range(n))), 1)
    adapted = _loss_of(model, batch, data) / units
    merged = merged_for_saving(model)
    result = _loss_of(merged, batch, data) / units
    dtype = next(merged.parameters()).dtype
    if not math.isclose(result, adapted, rel_tol=MERGE_TOLERANCE.get(dtype, 1e-2), abs_tol=1e-6):
        raise UserError(f"the merged LoRA model is not the trained model: its loss on {n} rows is {result:.6f}, the "
                        f"adapter model's {adapted:.6f}; model/ was not written. The adapter is in adapter/ (load it "
                        "over the base with peft); peft.merge=false saves only the adapter")
    log.info("LoRA merge checked: loss %.6f on %d rows, as the adapter model's (%.6f)", result, n, adapted)
    return merged


def _loss_of(model: nn.Module, batch: dict, data: TrainingData) -> float:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return float(data.task.model.merge_check_value(model, batch))
    finally:
        model.train(was_training)


def _say_dtype(dtype: torch.dtype) -> None:
    if dtype != torch.float32:
        log.info("model/: saved in %s, the checkpoint's dtype (model.save_dtype=auto; float32 keeps the trained fp32 "
                 "weights)", str(dtype).removeprefix("torch."))


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()
