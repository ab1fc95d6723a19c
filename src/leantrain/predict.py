"""Use a fine-tuned model folder: predictions for unlabelled rows, metrics for labelled ones."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from leantrain.config import Config
from leantrain.data.loaders import eval_loader
from leantrain.data.modalities import for_task
from leantrain.engine.evaluate import classification_metrics, predict_logits
from leantrain.engine.setup import has_accelerator, setup_logging
from leantrain.errors import UserError
from leantrain.model_names import resolve_model_name
from leantrain.preflight import check_weights
from leantrain.modeling import load_config, load_processor, trained_label_names
from leantrain.run_settings import with_run_settings
from leantrain.tasks import auto_model_class, resolve_task

log = logging.getLogger("leantrain")


def _load(model_dir: str, cfg: Config):
    from accelerate import Accelerator

    model_dir = resolve_model_name(model_dir, cfg.model.revision)
    mcfg = cfg.model.model_copy(update={"name": model_dir, "config": None, "config_type": None})
    task = resolve_task(cfg.model_copy(update={"model": mcfg}))
    labels = trained_label_names(load_config(mcfg))
    if labels is None:
        raise UserError(f"{model_dir} is not a fine-tuned classifier (no label names in its config.json); "
                        "train one with `leantrain train` first")
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()  # a training run earlier in this process must not leave its autocast behind
    accelerator = Accelerator(cpu=not has_accelerator(), mixed_precision="no")  # predictions in full precision
    setup_logging(accelerator.is_main_process)
    check_weights(model_dir, mcfg.allow_pickle)  # a pickle-only folder: a clear refusal, not an OSError
    model = auto_model_class(task).from_pretrained(
        model_dir, use_safetensors=None if mcfg.allow_pickle else True,
        revision=mcfg.revision, trust_remote_code=mcfg.trust_remote_code)
    processor = load_processor(mcfg, task)
    return accelerator, accelerator.prepare(model), (for_task(task), processor), labels


def _logits(accelerator, model, side, rows, cfg: Config, batch_size: int):
    modality, processor = side
    ds = modality.process(rows, processor, cfg.data, desc="Processing")
    collator = modality.collator(processor, cfg.data, train=False, device_type=accelerator.device.type)
    order = np.argsort(-np.asarray(ds["length"]), kind="stable")
    loader = accelerator.prepare(eval_loader(ds, batch_size, collator))
    outs = list(predict_logits(model, loader, accelerator))
    logits = torch.cat([o[0].cpu() for o in outs])
    unsorted = torch.empty_like(logits)
    unsorted[torch.as_tensor(order)] = logits  # back to the input's row order
    return unsorted


def predict(model_dir: str, input_path: str, output_path: str, cfg: Config, batch_size: int = 64,
            id_column: str | None = None) -> int:
    """Write one JSON line per input row in input order: {"row", "text" (and "text_pair") or "path", "label",
    "score"}; with ``id_column``, that column's value under "id" instead of the text. Returns the row count."""
    model_dir = resolve_model_name(model_dir, cfg.model.revision)
    accelerator, model, side, labels = _load(model_dir, cfg)
    cfg = with_run_settings(model_dir, cfg, input_path)  # the run's columns and max_length, unless set here
    rows, notes = side[0].load_rows(input_path, cfg.data, require_labels=False, known_labels=labels)
    for n in notes:
        log.info(n)
    rows = rows.remove_columns([c for c in ("label",) if c in rows.column_names])
    shown = _shown_fields(rows, side[0].name, input_path, cfg, id_column)
    probs = torch.softmax(_logits(accelerator, model, side, rows, cfg, batch_size), dim=-1)
    score, pred = probs.max(dim=-1)
    if accelerator.is_main_process:
        Path(output_path).parent.mkdir(parents=True, exist_ok=True)
        with open(output_path, "w") as f:
            for i, (p, s) in enumerate(zip(pred.tolist(), score.tolist())):
                record = {"row": i, **{k: v[i] for k, v in shown.items()}, "label": labels[p], "score": round(s, 6)}
                f.write(json.dumps(record, default=str) + "\n")
        log.info("wrote %d predictions to %s", len(pred), output_path)
    return len(pred)


def _shown_fields(rows, modality: str, input_path: str, cfg: Config, id_column: str | None) -> dict[str, list]:
    """What each prediction carries beside its label: the user's id column, else the input (text or file path)."""
    if id_column is None:
        if modality in ("image", "audio"):
            return {"path": rows[modality]}  # each prediction names its file
        return {k: rows[k] for k in ("text", "text_pair") if k in rows.column_names}
    from leantrain.data.validate import open_rows

    ds = open_rows(input_path, cfg.data).ds
    if id_column not in ds.column_names:
        raise UserError(f"--id-column {id_column!r}: {input_path} has no such column "
                        f"(columns: {', '.join(ds.column_names)})")
    if len(ds) != len(rows):
        raise UserError(f"--id-column: {input_path} has {len(ds)} rows but {len(rows)} were read for prediction")
    return {"id": ds[id_column]}


def evaluate_file(model_dir: str, cfg: Config, output_path: str | None, batch_size: int = 64) -> dict:
    """Metrics of a saved model on a labelled file (``data.eval``), per class too, and a confusion matrix written
    next to ``output_path`` (x.json -> x.confusion.json / .png) or into the run folder (eval_confusion.*)."""
    if not cfg.data.eval:
        raise UserError("leantrain eval needs labelled data: data.eval=path/to/file")
    from leantrain.report.eval_report import confusion, confusion_stem, per_class, write_confusion

    model_dir = resolve_model_name(model_dir, cfg.model.revision)
    accelerator, model, side, labels = _load(model_dir, cfg)
    cfg = with_run_settings(model_dir, cfg, cfg.data.eval)  # the run's columns and max_length, unless set here
    rows, notes = side[0].load_rows(cfg.data.eval, cfg.data, require_labels=True, known_labels=labels)
    for n in notes:
        log.info(n)
    logits = _logits(accelerator, model, side, rows, cfg, batch_size)
    y = np.asarray(rows["label"])
    preds = logits.argmax(-1).numpy()
    losses = torch.nn.functional.cross_entropy(logits, torch.as_tensor(y), reduction="none").numpy()
    metrics = classification_metrics(preds, y, losses, len(labels))
    metrics["per_class"] = per_class(preds, y, labels)
    result = {"model": model_dir, "data": cfg.data.eval, "eval": metrics}
    if accelerator.is_main_process:
        cm = confusion(preds, y, labels)
        json_path, png_path = write_confusion(confusion_stem(model_dir, output_path), cm,
                                              f"{Path(model_dir).name} on {Path(cfg.data.eval).name}")
        result["confusion_matrix"] = {"json": str(json_path), "png": str(png_path)}
        log.info("confusion matrix: %s, %s", json_path, png_path)
        if output_path:
            from leantrain.report.logs import write_json

            write_json(output_path, result)
    return result
