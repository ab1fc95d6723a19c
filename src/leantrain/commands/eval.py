"""``leantrain eval``: the metrics of a fine-tuned model folder on labelled data (``data.eval``)."""

from __future__ import annotations

import json
import logging

import numpy as np
import torch

from leantrain.commands.predict import load_trained, logits_in_row_order
from leantrain.config import Config, resolve
from leantrain.engine.evaluate import classification_metrics
from leantrain.errors import UserError
from leantrain.report.logs import write_json

log = logging.getLogger("leantrain")


def evaluate_file(model_dir: str, cfg: Config, output_path: str | None, batch_size: int = 64) -> dict:
    """Metrics of a saved model on a labelled file (``data.eval``)."""
    if not cfg.data.eval:
        raise UserError("leantrain eval needs labelled data: data.eval=path/to/file")
    accelerator, model, side, labels = load_trained(model_dir, cfg)
    rows, notes = side[0].load_rows(cfg.data.eval, cfg.data, require_labels=True, known_labels=labels)
    for n in notes:
        log.info(n)
    logits = logits_in_row_order(accelerator, model, side, rows, cfg, batch_size)
    y = np.asarray(rows["label"])
    losses = torch.nn.functional.cross_entropy(logits, torch.as_tensor(y), reduction="none").numpy()
    metrics = classification_metrics(logits.argmax(-1).numpy(), y, losses, len(labels))
    result = {"model": model_dir, "data": cfg.data.eval, "eval": metrics}
    if output_path and accelerator.is_main_process:
        write_json(output_path, result)
    return result


def eval_command(model_dir: str, overrides: list[str], output_path: str | None, *, batch_size: int = 64) -> int:
    """``leantrain eval``: the metrics on labelled data (data.eval=...), printed as JSON."""
    result = evaluate_file(model_dir, resolve(None, overrides), output_path, batch_size=batch_size)
    print(json.dumps(result["eval"], indent=2))
    return 0
