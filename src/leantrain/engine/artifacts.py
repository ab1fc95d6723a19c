"""What a run leaves behind: config.yaml, model/ (save_pretrained + processor + model card), summary.json,
loss_curve.png. Rank 0 writes; every rank contributes its peak memory."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from leantrain.engine.distributed import full_state_dict
from leantrain.modeling import PACKAGED_MODEL
from leantrain.perf.memory import device_memory, peak_rss_bytes
from leantrain.report.logs import write_json

log = logging.getLogger("leantrain")


def versions() -> dict[str, str]:
    import accelerate
    import datasets
    import transformers

    import leantrain

    return {"leantrain": leantrain.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "accelerate": accelerate.__version__, "datasets": datasets.__version__}


def peak_memory(accelerator) -> dict[str, int]:
    """The largest peak over all processes (a collective: every rank must call it)."""
    mine = torch.tensor([peak_rss_bytes(), *device_memory(accelerator.device).values()], dtype=torch.float64,
                        device=accelerator.device)
    peak = accelerator.reduce(mine, reduction="max") if accelerator.num_processes > 1 else mine
    keys = ["peak_memory_bytes", *device_memory(accelerator.device).keys()]
    return {k: int(v) for k, v in zip(keys, peak.tolist())}


def save_outputs(cfg, accelerator, model, inputs, *, counts, meter, plan, last_eval, records, wall_seconds,
                 distributed: dict, optim_state: dict | None = None, extra: dict | None = None,
                 extra_train: dict | None = None, efficiency: dict | None = None) -> dict:
    """``extra``: sections merged into the summary (e.g. {"train": {"steps": ...}, "best": {...}});
    ``extra_train``: more keys for the summary's train section (MFU, time split, ...)."""
    out = Path(cfg.output_dir)
    memory = peak_memory(accelerator)
    state_dict = full_state_dict(model)  # gathered from the shards under FSDP (every rank takes part)
    accelerator.wait_for_everyone()
    summary = {
        "output_dir": str(out),
        "eval": last_eval,
        "train": {
            "steps": meter.steps,
            "epochs": round(meter.steps / plan.steps_per_epoch, 4),
            "samples": meter.all_samples,
            "samples_per_second": meter.samples_per_second,
            "tokens_per_second": meter.tokens_per_second,
            "measured_steps": meter.measured_steps,
            "warmup_steps_excluded": min(meter.skip, meter.steps) if meter.steps > meter.skip else 0,
            "loop_seconds": meter.all_time,
            "wall_seconds": wall_seconds,
            "batch_size": plan.batch_size,
            "micro_batch_size": plan.micro_batch_size,
            "accumulation_steps": plan.accum,
            "final_loss": next((r["loss"] for r in reversed(records) if r.get("type") == "train"), None),
            **memory,
            **(extra_train or {}),
        },
        "efficiency": efficiency or {},
        "model": {"name": inputs.model_name, "class": type(accelerator.unwrap_model(model)).__name__,
                  "parameters": counts, "labels": inputs.label_names},
        "optim": optim_state or {"name": cfg.optim.name},
        "data": {"train_rows": len(inputs.train), "eval_rows": len(inputs.eval), "columns": inputs.columns},
        "distributed": distributed,
        "device": {"type": accelerator.device.type, "name": _device_name(accelerator.device),
                   "threads": torch.get_num_threads()},
        "versions": versions(),
    }
    for key, value in (extra or {}).items():
        summary[key] = {**summary[key], **value} if isinstance(summary.get(key), dict) else value
    if accelerator.is_main_process:
        (out / "config.yaml").write_text(cfg.to_yaml())
        model_dir = out / "model"
        accelerator.unwrap_model(model).save_pretrained(model_dir, state_dict=state_dict, safe_serialization=True)
        inputs.processor.save_pretrained(model_dir)  # tokenizer / preprocessor_config.json: pipeline() loads it
        write_json(out / "summary.json", summary)
        _report_files(cfg, out, model_dir, inputs, summary, records)
        log.info("saved %s (model/, summary.json, metrics.jsonl, config.yaml)", out)
        ev = summary["eval"]
        if ev:
            log.info("eval accuracy %.4f, macro-F1 %.4f, loss %.4f on %d examples",
                     ev["accuracy"], ev["f1_macro"], ev["loss"], ev["samples"])
    accelerator.wait_for_everyone()
    return summary


def _report_files(cfg, out: Path, model_dir: Path, inputs, summary: dict, records: list) -> None:
    from leantrain.report.card import write_model_card

    base = inputs.model_name if cfg.model.config or cfg.model.config_type else cfg.model.name or PACKAGED_MODEL
    write_model_card(model_dir, base_model=base, label_names=inputs.label_names, summary=summary,
                     config=cfg.to_dict(), task=inputs.task)
    if cfg.report.plots:
        from leantrain.report.plots import plot_loss_curve, short_model_name

        plot_loss_curve(records, out / "loss_curve.png", title=f"{short_model_name(inputs.model_name)} — {out.name}")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return platform.processor() or platform.machine()
