"""``leantrain eval``: the metrics of a fine-tuned model folder on ``data.eval``. A task evaluated by rows
(``Task.evaluated_by_rows``: classifiers, regression, tagging) on labelled rows: its metrics from each row's
prediction, per class too, with a confusion matrix (JSON and PNG). Any other (``evaluate_as_training``): as a
training run's evaluation computes them (the same data side, blocks of the run's ``data.block_size``, the task's
eval outputs): a causal language model's ``eval.loss`` (the mean cross-entropy over every target token) and
``eval.perplexity``; a preference-tuned policy's rewards on pairs against the reference it recorded
(``eval.reward_accuracy``, ``eval.reward_margin``, ...); a reward model's pairwise ``eval.accuracy``.

``--harness DIR --tasks a,b``: instead, EleutherAI's lm-evaluation-harness on a causal LM folder with the task YAMLs
of DIR (``engine/evaluation/harness.py``), its table printed and ``{"harness": {task: {metric: value}}}`` written to
``--output``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets

from leantrain.commands.generate import load_causal_lm_model, load_causal_lm_tokenizer, model_folder
from leantrain.commands.predict import load_trained, logits_in_row_order
from leantrain.config import Config, resolve
from leantrain.data.loaders import eval_loader
from leantrain.data.text_loader import first_rows
from leantrain.engine.devices.accelerator import has_accelerator, setup_logging
from leantrain.engine.devices.connector import choose_paths
from leantrain.engine.devices.efficiency import ACCELERATE_PRECISION
from leantrain.engine.devices.paths import PathsContext
from leantrain.engine.evaluation.eval_plan import UNRECORDED_WIDTH, planned_eval_width, with_eval_reference
from leantrain.engine.evaluation.evaluate import evaluate
from leantrain.engine.evaluation.harness import run_harness
from leantrain.engine.setup.preflight import check_max_length, check_output_file, check_weights
from leantrain.engine.setup.run_settings import (FILE as RUN_FILE, eval_precision, stored_eval_width, trained_task,
                                          with_run_settings)
from leantrain.errors import ConfigError, UserError
from leantrain.heartbeat import reporting
from leantrain.modeling import load_processor, load_trained_model
from leantrain.modeling.hubcheck import check_model_name, looks_local
from leantrain.modeling.load import load_config
from leantrain.modeling.names import resolve_model_name
from leantrain.methods import Task
from leantrain.report.eval_report import confusion, confusion_stem, format_table, per_class, write_confusion
from leantrain.report.logs import write_json
from leantrain.report.progress import Progress

log = logging.getLogger("leantrain")
ROWS_BATCH = 64  # rows a batch of a task evaluated by rows (its logits are one row of classes each)


def evaluate_file(model_dir: str, cfg: Config, output_path: str | None, batch_size: int | None = None) -> dict:
    """Metrics of a saved model on a labelled file (``data.eval``), per class too, and a confusion matrix written
    next to ``output_path`` (x.json -> x.confusion.json / .png) or into the run folder (eval_confusion.*)."""
    if not cfg.data.eval:
        raise UserError("leantrain eval needs labelled data: data.eval=path/to/file")
    model_dir = resolve_model_name(model_dir, cfg.model.revision)
    mcfg = cfg.model.model_copy(update={"name": model_dir, "config": None, "config_type": None})
    task = trained_task(model_dir, cfg.model_copy(update={"model": mcfg}))
    if not task.traits.evaluated_by_rows:  # a language model: loss and perplexity; a paired task: its metrics on pairs
        return evaluate_as_training(model_dir, task, cfg, output_path, batch_size)
    precision = eval_precision(model_dir, cfg)  # the run's own, so that both report the same metrics
    accelerator, model, side, labels, task = load_trained(model_dir, cfg, precision)
    paths = choose_paths(model, PathsContext("eval", accelerator.device, traits=task.traits))  # logits of classes
    for line in paths.lines():
        log.info(line)
    cfg = with_run_settings(model_dir, cfg, cfg.data.eval)  # the run's columns and max_length, unless set here
    rows, notes = eval_rows(side[0], cfg, require_labels=True, known_labels=labels)
    for n in notes:
        log.info(n)
    processed: list = []
    logits = logits_in_row_order(accelerator, model, side, rows, cfg, batch_size or ROWS_BATCH, processed)
    y = task.evaluation.row_labels(rows, processed[0])
    values = {k: v.numpy() for k, v in task.evaluation.batch(logits, y).items()}
    y = y.numpy()
    metrics = task.evaluation.all_metrics(values, labels)
    classes = task.traits.class_labels  # per class and a confusion matrix: for class labels
    preds = values.get("preds")  # multi-label has probabilities instead
    if classes:
        metrics["per_class"] = per_class(preds, y, labels)
    result = {"model": model_dir, "data": cfg.data.eval, "precision": precision[0], "eval": metrics,
              "paths": paths.record()}
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


def eval_rows(side, cfg: Config, **kw):  # noqa: ANN001, ANN201 - a data side, its rows
    """``data.eval``'s rows as the data side loads them for ``eval`` (rows, notes), the first
    ``data.max_eval_samples`` of them (a language model's token blocks are cut by their own side)."""
    rows, notes = side.load_rows(cfg.data.eval, cfg.data, **kw)
    if isinstance(rows, datasets.Dataset):
        rows = first_rows(rows, cfg.data.max_eval_samples, "data.max_eval_samples", "eval", notes)
    return rows, notes


def evaluate_as_training(model_dir: str, task: Task, cfg: Config, output_path: str | None,
                         batch_size: int | None = None) -> dict:
    """The metrics of ``task``'s evaluation in a training run: {"model", "data", "block_size", "precision",
    "batch_size", "eval": (a language model) {"loss", "perplexity", "samples", "tokens"}}; written to
    ``output_path`` (rank 0). As the run's evaluation computes them (``engine.eval_plan``): in the run's precision
    unless efficiency.precision is set here, at the run's width (``batch_size``, train.eval_batch_size or the
    recorded one) planned against the memory budget, the chunked output layer on the policy and its reference."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    mcfg = cfg.model.model_copy(update={"name": model_dir, "config": None, "config_type": None})
    cfg = with_run_settings(model_dir, cfg, None)  # the run's data.block_size unless set here
    cfg = check_max_length(cfg.model_copy(update={"model": mcfg}))  # data.block_size within the model's positions
    AcceleratorState._reset_state()  # a training run earlier in this process must not leave its autocast behind
    precision, why = eval_precision(model_dir, cfg)  # the run's own, so that both report the same loss
    accelerator = Accelerator(cpu=not has_accelerator(), mixed_precision=ACCELERATE_PRECISION[precision])
    setup_logging(accelerator.is_main_process)
    log.info(why)
    configured = task.configured(cfg, load_config(mcfg))  # preference: the recorded loss settings, reference
    configured.evaluation.check_evaluable()  # before any weight or data loads
    reference = configured.evaluation.reference_model_name()
    folder = reference_folder(reference, model_dir) if reference else None
    check_weights(model_dir, mcfg.allow_pickle)
    side = configured.data.side()  # as the method reads it with the recorded settings (GRPO's environment)
    split, notes = eval_rows(side, cfg, require_labels=False, known_labels=None)
    detected = side.detected(split)
    configured.data.check(detected)  # training's check of the data against the loss, before the model
    configured = configured.data.for_data(detected)  # the method for this data (a KTO policy on pairs: DPO's metrics)
    model = load_trained_model(model_dir, task, mcfg).to(accelerator.device)
    paths = choose_paths(model, PathsContext(  # the output loss as training chose it (no [B, T, V] logits), the
        "eval", accelerator.device, cfg.efficiency, traits=configured.traits))  # decode step, the first-token layer
    for line in paths.lines():
        log.info(line)
    tokenizer = load_processor(mcfg, task)
    configured = configured.data.with_processor(tokenizer)  # a method that decodes what it generates keeps it
    for n in notes:
        log.info(n)
    blocks = side.process(split, tokenizer, cfg.data, desc="Processing eval")
    collator = side.collator(tokenizer, cfg.data, train=False, device_type=accelerator.device.type)
    if folder:  # against the reference the policy was tuned from, frozen
        log.info("reference: %s", reference)
        check_weights(folder, mcfg.allow_pickle)
        configured = with_eval_reference(configured, model, load_trained_model(folder, task, mcfg.model_copy(
            update={"name": folder})).to(accelerator.device), accelerator.autocast)  # the policy's precision
    width = eval_batch_width(model_dir, cfg, batch_size, model, configured, blocks, precision)
    model, loader = accelerator.prepare(model, eval_loader(blocks, width, collator))
    progress = Progress(0, enabled=accelerator.is_main_process, mode=cfg.report.progress)  # a long eval says how far
    with reporting(progress.sink):
        metrics = evaluate(model, loader, accelerator, 0, configured, [])
    result = {"model": model_dir, "data": cfg.data.eval, "block_size": cfg.data.block_size, "precision": precision,
              "batch_size": width, "eval": metrics, "paths": paths.record()}
    if accelerator.is_main_process and output_path:
        write_json(output_path, result)
    return result


def harness_eval(name: str, harness: str | None, tasks: list[str], output_path: str | None, *,
                 batch_size: int = 8, limit: int | None = None) -> dict:
    """The harness's scores of a causal LM folder (a run folder stands for its model/; a LoRA adapter folder is
    merged over its base), printed as the harness's table; written to ``output_path`` as ``{"harness": ...}``."""
    setup_logging(True)
    if not tasks:
        raise UserError("--tasks: name at least one task of the harness folder, e.g. --tasks arith,qa")
    folder = model_folder(name)
    check_weights(folder, allow_pickle=False)
    model = load_causal_lm_model(folder)
    tokenizer = load_causal_lm_tokenizer(folder)
    values, table = run_harness(model, tokenizer, tasks, harness, batch_size=batch_size, limit=limit)
    print(table)
    result = {"model": folder, "harness_dir": harness, "harness": values}
    if output_path:
        write_json(output_path, result)
    return result


def reference_folder(reference: str, model_dir: str) -> str:
    """The folder (or Hub id) of the reference ``model_dir`` recorded (a short name resolved); exit 2 naming it when
    it is not there (a base folder deleted or moved since the run)."""
    folder = resolve_model_name(reference, None)  # a short name (smollm2-135m) or a folder
    try:
        check_model_name(folder)
    except ConfigError as e:
        why = "no such folder (deleted or moved since the run?)" if looks_local(folder) else str(e).split(": ", 1)[-1]
        raise UserError(f"{model_dir} was preference-tuned against the reference model {folder} (recorded in its "
                        f"config.json and {RUN_FILE}), and leantrain eval compares the policy with it: {why}; put "
                        "the reference back where it was") from None
    return folder


def eval_batch_width(model_dir: str, cfg: Config, batch_size: int | None, model, task: Task, blocks,
                     precision: str) -> int:
    """Rows a batch: --batch-size, else train.eval_batch_size set here, else the run's own (recorded with the model),
    else at most ``UNRECORDED_WIDTH``; then halved until an evaluation forward fits the memory budget."""
    if batch_size:
        wanted, source = batch_size, "--batch-size"
    elif "eval_batch_size" in cfg.train.model_fields_set and cfg.train.eval_batch_size:
        wanted, source = cfg.train.eval_batch_size, "train.eval_batch_size"
    elif (recorded := stored_eval_width(model_dir)) is not None:
        wanted, source = recorded, "the training run's evaluation"
    else:
        wanted, source = UNRECORDED_WIDTH, "the folder does not record its run's"
    seq_len = cfg.data.block_size or int(max(blocks["length"], default=1))
    width, why = planned_eval_width(model, task, wanted, seq_len, precision, cfg.efficiency.memory_budget)
    log.info("eval batch: %d rows a process (%s%s; %s)", width, source,
             "" if width == wanted else f": {wanted}, halved to fit", why)
    return width


def eval_command(model_dir: str, overrides: list[str], output_path: str | None, *, batch_size: int | None = None,
                 harness: str | None = None, tasks: list[str] | None = None, limit: int | None = None) -> int:
    """``leantrain eval``: the metrics on labelled data (data.eval=...), printed as JSON, then a per-class table;
    with ``--harness`` / ``--tasks``: the evaluation harness's scores."""
    cfg = resolve(None, overrides)
    if output_path:
        check_output_file(output_path, "--output", "metrics.json")
    if harness is not None or tasks:
        harness_eval(model_dir, harness, tasks or [], output_path, batch_size=min(batch_size or 8, 8), limit=limit)
        return 0
    result = evaluate_file(model_dir, cfg, output_path, batch_size=batch_size)
    print(json.dumps({k: v for k, v in result["eval"].items() if k != "per_class"}, indent=2))
    if "per_class" in result["eval"]:
        print(format_table(result["eval"]["per_class"]))
    return 0
