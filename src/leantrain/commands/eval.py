"""``leantrain eval``: the metrics of a fine-tuned model folder on labelled data (``data.eval``), per class too,
with a confusion matrix (JSON and PNG)."""

from __future__ import annotations

import json
import logging
from pathlib import Path


from leantrain.commands.eval_lm import evaluate_language_model
from leantrain.commands.predict import load_trained, logits_in_row_order
from leantrain.config import Config, resolve
from leantrain.engine.preflight import check_output_file
from leantrain.engine.run_settings import eval_precision, stored_task, with_run_settings
from leantrain.errors import UserError
from leantrain.modeling import resolve_task
from leantrain.modeling.names import resolve_model_name
from leantrain.modeling.tasks import TASKS, get_task
from leantrain.report.eval_report import confusion, confusion_stem, format_table, per_class, write_confusion
from leantrain.report.logs import write_json

log = logging.getLogger("leantrain")


def evaluate_file(model_dir: str, cfg: Config, output_path: str | None, batch_size: int = 64) -> dict:
    """Metrics of a saved model on a labelled file (``data.eval``), per class too, and a confusion matrix written
    next to ``output_path`` (x.json -> x.confusion.json / .png) or into the run folder (eval_confusion.*)."""
    if not cfg.data.eval:
        raise UserError("leantrain eval needs labelled data: data.eval=path/to/file")
    model_dir = resolve_model_name(model_dir, cfg.model.revision)
    mcfg = cfg.model.model_copy(update={"name": model_dir, "config": None, "config_type": None})
    task_name = resolve_task(cfg.model_copy(update={"model": mcfg}))
    recorded = stored_task(model_dir)
    if cfg.model.task == "auto" and recorded in TASKS and get_task(recorded).spec.labels == "pairs":
        task_name = recorded  # a preference-tuned policy or a reward model: its metrics on pairs
    if not get_task(task_name).labelled or get_task(task_name).spec.labels == "pairs":  # a language model: loss
        return evaluate_language_model(model_dir, task_name, cfg, output_path, batch_size)  # and perplexity; rewards
    precision = eval_precision(model_dir, cfg)  # the run's own, so that both report the same metrics
    accelerator, model, side, labels, task = load_trained(model_dir, cfg, precision)
    cfg = with_run_settings(model_dir, cfg, cfg.data.eval)  # the run's columns and max_length, unless set here
    rows, notes = side[0].load_rows(cfg.data.eval, cfg.data, require_labels=True, known_labels=labels)
    for n in notes:
        log.info(n)
    processed: list = []
    logits = logits_in_row_order(accelerator, model, side, rows, cfg, batch_size, processed)
    y = task.row_labels(rows, processed[0])
    values = {k: v.numpy() for k, v in task.eval_batch(logits, y).items()}
    y = y.numpy()
    metrics = task.all_metrics(values, labels)
    classes = task.class_labels  # per class and a confusion matrix: for class labels
    preds = values.get("preds")  # multi-label has probabilities instead
    if classes:
        metrics["per_class"] = per_class(preds, y, labels)
    result = {"model": model_dir, "data": cfg.data.eval, "precision": precision[0], "eval": metrics}
    if accelerator.is_main_process and not classes:
        if output_path:
            write_json(output_path, result)
    elif accelerator.is_main_process:
        cm = confusion(preds, y, labels)
        json_path, png_path = write_confusion(confusion_stem(model_dir, output_path), cm,
                                              f"{Path(model_dir).name} on {Path(cfg.data.eval).name}")
        result["confusion_matrix"] = {"json": str(json_path), "png": str(png_path)}
        log.info("confusion matrix: %s, %s", json_path, png_path)
        if output_path:
            write_json(output_path, result)
    return result


def eval_command(model_dir: str, overrides: list[str], output_path: str | None, *, batch_size: int = 64) -> int:
    """``leantrain eval``: the metrics on labelled data (data.eval=...), printed as JSON, then a per-class table."""
    cfg = resolve(None, overrides)
    if output_path:
        check_output_file(output_path, "--output", "metrics.json")
    result = evaluate_file(model_dir, cfg, output_path, batch_size=batch_size)
    print(json.dumps({k: v for k, v in result["eval"].items() if k != "per_class"}, indent=2))
    if "per_class" in result["eval"]:
        print(format_table(result["eval"]["per_class"]))
    return 0
