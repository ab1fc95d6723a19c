"""``leantrain predict``: a fine-tuned model folder's predictions for unlabelled rows (also what ``eval`` loads with)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from leantrain.config import Config, resolve
from leantrain.data.loaders import eval_loader
from leantrain.engine.devices.accelerator import has_accelerator, setup_logging
from leantrain.engine.evaluation.evaluate import predict_logits
from leantrain.errors import UserError
from leantrain.data.text_loader import open_rows
from leantrain.engine.setup.preflight import check_output_file, check_weights
from leantrain.engine.devices.efficiency import ACCELERATE_PRECISION
from leantrain.engine.setup.run_settings import with_run_settings
from leantrain.modeling import load_config, load_processor, load_trained_model, trained_label_names
from leantrain.modeling.names import resolve_model_name
from leantrain.methods import Task, resolve_task

log = logging.getLogger("leantrain")


def load_trained(model_dir: str, cfg: Config, precision: tuple[str, str] | None = None):
    """A fine-tuned model folder, ready to predict: (accelerator, prepared model, (data side, processor), labels,
    the registered task). ``precision``: (precision, the log line saying why), else fp32 (predictions)."""
    from accelerate import Accelerator

    model_dir = resolve_model_name(model_dir, cfg.model.revision)
    mcfg = cfg.model.model_copy(update={"name": model_dir, "config": None, "config_type": None})
    task = resolve_task(cfg.model_copy(update={"model": mcfg}))
    task.prediction.check(model_dir)  # a language model has no labels to predict
    labels = trained_label_names(load_config(mcfg))
    if labels is None:
        raise UserError(f"{model_dir} is not a fine-tuned classifier (no label names in its config.json); "
                        "train one with `leantrain train` first")
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()  # a training run earlier in this process must not leave its autocast behind
    name, why = precision or ("fp32", None)  # predictions in full precision unless asked
    accelerator = Accelerator(cpu=not has_accelerator(), mixed_precision=ACCELERATE_PRECISION[name])
    setup_logging(accelerator.is_main_process)
    if why:
        log.info(why)
    check_weights(model_dir, mcfg.allow_pickle)  # a pickle-only folder: a clear refusal, not an OSError
    model = load_trained_model(model_dir, task, mcfg)
    processor = load_processor(mcfg, task)
    configured = task.configured(cfg, model.config)  # multi-label: the threshold it was saved with
    return accelerator, accelerator.prepare(model), (task.data.side(), processor), labels, configured


def logits_in_row_order(accelerator, model, side, rows, cfg: Config, batch_size: int, processed: list | None = None
                        ) -> torch.Tensor:
    """The model's logits for ``rows`` (read longest first, returned in the rows' order); per-token logits are
    padded to the longest row. ``processed``: a list that receives the processed rows."""
    modality, processor = side
    ds = modality.process(rows, processor, cfg.data, desc="Processing")
    if processed is not None:
        processed.append(ds)
    collator = modality.collator(processor, cfg.data, train=False, device_type=accelerator.device.type)
    order = np.argsort(-np.asarray(ds["length"]), kind="stable")
    loader = accelerator.prepare(eval_loader(ds, batch_size, collator))
    outs = [o[0].cpu() for o in predict_logits(model, loader, accelerator)]
    if outs and outs[0].dim() > 2:  # per-token logits (batch, width, labels): one width for all
        width = max(o.shape[1] for o in outs)
        outs = [torch.nn.functional.pad(o, (0, 0, 0, width - o.shape[1])) for o in outs]
    logits = torch.cat(outs)
    unsorted = torch.empty_like(logits)
    unsorted[torch.as_tensor(order)] = logits  # back to the input's row order
    return unsorted


def predict(model_dir: str, input_path: str, output_path: str, cfg: Config, batch_size: int = 64,
            id_column: str | None = None) -> int:
    """Write one JSON line per input row in input order: {"row", "text" (and "text_pair") or "path", then the
    task's prediction (classification: "label", "score")}; with ``id_column``, that column's value under "id"
    instead of the text. Returns the row count."""
    model_dir = resolve_model_name(model_dir, cfg.model.revision)
    accelerator, model, side, labels, task = load_trained(model_dir, cfg)
    cfg = with_run_settings(model_dir, cfg, input_path)  # the run's columns and max_length, unless set here
    rows, notes = side[0].load_rows(input_path, cfg.data, require_labels=False, known_labels=labels)
    for n in notes:
        log.info(n)
    rows = rows.remove_columns([c for c in ("label",) if c in rows.column_names])
    shown = _shown_fields(rows, task, input_path, cfg, id_column)
    processed: list = []
    logits = logits_in_row_order(accelerator, model, side, rows, cfg, batch_size, processed)
    predicted = task.prediction.rows(logits, labels, rows, processed[0])
    if accelerator.is_main_process:
        Path(output_path).parent.mkdir(parents=True, exist_ok=True)
        with open(output_path, "w") as f:
            for i, prediction in enumerate(predicted):
                record = {"row": i, **{k: v[i] for k, v in shown.items()}, **prediction}
                f.write(json.dumps(record, default=str) + "\n")
        log.info("wrote %d predictions to %s", len(predicted), output_path)
    return len(predicted)


def _shown_fields(rows, task: Task, input_path: str, cfg: Config, id_column: str | None) -> dict[str, list]:
    """What each prediction carries beside its label: the user's id column, else the input (text or file path)."""
    if id_column is None:
        return task.prediction.shown(rows)
    ds = open_rows(input_path, cfg.data).ds
    if id_column not in ds.column_names:
        raise UserError(f"--id-column {id_column!r}: {input_path} has no such column "
                        f"(columns: {', '.join(ds.column_names)})")
    if len(ds) != len(rows):
        raise UserError(f"--id-column: {input_path} has {len(ds)} rows but {len(rows)} were read for prediction")
    return {"id": ds[id_column]}


def predict_command(model_dir: str, input_path: str, output_path: str, overrides: list[str], *,
                    batch_size: int = 64, id_column: str | None = None) -> int:
    """``leantrain predict``: one JSON line per input row."""
    cfg = resolve(None, overrides)
    check_output_file(output_path, "--output")
    predict(model_dir, input_path, output_path, cfg, batch_size=batch_size, id_column=id_column)
    return 0
