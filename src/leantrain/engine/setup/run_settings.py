"""What the run knew, kept with the model: ``model/leantrain.json`` holds the task and the data settings the model
was trained with (its columns and ``max_length``; a language model's ``block_size``, ``document_separator`` and
``document_mask``; instruction data's template, system prompt and format), so that ``leantrain predict`` / ``eval``
/ ``generate`` on the folder use them by default. A key the user sets (``data.text_column=...``) wins; a stored
column that the input file lacks is not used (the usual auto-detection applies), so a file with other column names
still works.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from leantrain.config import Config
from leantrain.data.text_loader import open_rows
from leantrain.engine.devices.accelerator import device_type
from leantrain.engine.devices.efficiency import resolve_precision
from leantrain.errors import UserError
from leantrain.methods import TASKS, TOKEN_KEYS, Task, resolve_task

log = logging.getLogger("leantrain")

FILE = "leantrain.json"
COLUMN_KEYS = ("text_column", "text_pair_column", "label_column", "image_column", "audio_column")


def run_settings(cfg: Config, task: Task, columns: dict, precision: str | None = None,
                 saved: dict | None = None, eval_batch_size: int | None = None) -> dict:
    """The JSON written next to the weights: {"task", "data": {<role>_column: name, "max_length": n}, "precision":
    the precision the run trained and evaluated in, "eval_batch_size": the rows a process evaluated at once}, and the
    task's ``saved`` record (``Task.report.saved_config``: a preference-tuned policy's method, beta and reference)."""
    data = {f"{role}_column": name for role, name in columns.items() if name and f"{role}_column" in COLUMN_KEYS}
    data["max_length"] = task.data.sequence_length(cfg.data)  # the one length train, eval, predict and pipeline() cut at
    tokens, rendering = task.data.saved_settings(cfg.data, columns)  # a language model's eval cuts as the run did
    data.update(tokens)
    return {"task": task.name, "data": data, **({"prompt_format": rendering} if rendering else {}),
            **({"precision": precision} if precision else {}),
            **({"eval_batch_size": eval_batch_size} if eval_batch_size else {}), **(saved or {})}


def cut_like_training(processor, task: Task, cfg: Config) -> None:  # noqa: ANN001 - a tokenizer
    """The tokenizer about to be saved with a model that scores texts (not a text generator) gets the run's length as
    its ``model_max_length`` when that is lower: ``pipeline(..., truncation=True)`` then cuts where training did."""
    length, traits = task.data.sequence_length(cfg.data), task.traits
    limit = getattr(processor, "model_max_length", None) or length + 1
    if traits.tokenized and not traits.generates and length < limit:
        processor.model_max_length = length


def write_run_settings(model_dir: Path, cfg: Config, task: Task, columns: dict, precision: str | None = None,
                       saved: dict | None = None, eval_batch_size: int | None = None) -> None:
    settings = run_settings(cfg, task, columns, precision, saved, eval_batch_size)
    (Path(model_dir) / FILE).write_text(json.dumps(settings, indent=2) + "\n")


def eval_precision(model_dir: str | Path, cfg: Config) -> tuple[str, str]:
    """The precision ``leantrain eval`` computes in: efficiency.precision when set here, else the run's own (from
    model/leantrain.json: the precision of the run's evaluation, so both report the same numbers), else auto.
    Returns (leantrain's name: fp32, bf16, ..., the line that says which and why, for the log)."""
    if "precision" in cfg.efficiency.model_fields_set:
        requested, source = cfg.efficiency.precision, "efficiency.precision"
    else:
        stored = (read_run_settings(model_dir) or {}).get("precision")
        requested = stored or cfg.efficiency.precision
        source = (f"the training run's, from {Path(model_dir) / FILE}" if stored else
                  "efficiency.precision=auto (the folder does not record its run's)")
    precision, why = resolve_precision(requested, device_type())
    return precision, (f"precision: {precision} ({source}{'' if why == 'as configured' else f': {why}'}; set "
                       "efficiency.precision=fp32|bf16 to change)")


def stored_prompt_format(model_dir: str | Path) -> dict | None:
    """How the run's prompts were rendered ({"format": instruction or preference format, "prompt": text or messages}
    from model/leantrain.json), for ``leantrain.data.lm.sft.sample_inputs``; None for plain text or no record."""
    return (read_run_settings(model_dir) or {}).get("prompt_format")


def stored_eval_width(model_dir: str | Path) -> int | None:
    """The rows a process of the run evaluated at once (model/leantrain.json), or None (not recorded)."""
    value = (read_run_settings(model_dir) or {}).get("eval_batch_size")
    return int(value) if isinstance(value, int) and value > 0 else None


def stored_task(model_dir: str | Path) -> str | None:
    """The task the run recorded in ``model/leantrain.json``, or None."""
    stored = read_run_settings(model_dir) or {}
    return stored.get("task")


def trained_task(model_dir: str | Path, cfg: Config) -> Task:
    """The task of a trained model folder (``cfg.model`` naming it): ``model.task``, or what ``auto`` decides from its
    config; under auto, the task the run recorded when its model is of the class auto found (a preference-tuned or
    GRPO-trained policy, a reward model: their config says causal LM or sequence classifier) keeps it."""
    task = resolve_task(cfg)
    recorded = TASKS.get(stored_task(model_dir) or "")
    kept = cfg.model.task == "auto" and recorded is not None and recorded.traits.auto_model == task.traits.auto_model
    return recorded if kept else task


def read_run_settings(model_dir: str | Path) -> dict | None:
    path = Path(model_dir) / FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        log.warning("warning: %s is not valid JSON; the run's data settings are not used", path)
        return None


def with_run_settings(model_dir: str | Path, cfg: Config, input_path: str | None,
                      keys: tuple[str, ...] = COLUMN_KEYS + ("max_length", *TOKEN_KEYS)) -> Config:
    """``cfg`` with the run's data settings (those of ``keys``) as defaults: keys the user set stay, and a stored
    column is used only when the input is a file (or dataset) that has it; folders of images / audio keep their own
    layout. Logs what was taken."""
    stored = read_run_settings(model_dir)
    if not stored:
        return cfg
    given = cfg.data.model_fields_set
    available = _columns_of(input_path, cfg)
    taken = {}
    for key, value in (stored.get("data") or {}).items():
        if key in given or value is None or key not in keys:
            continue
        wanted = value if isinstance(value, list) else [value]  # data.label_column: a list of 0/1 columns
        if key in COLUMN_KEYS and (available is None or any(v not in available for v in wanted)):
            continue
        taken[key] = value
    if not taken:
        return cfg
    log.info("using the run's data settings from %s: %s (set data.<key>=... to change)",
             Path(model_dir) / FILE, ", ".join(f"data.{k}={v!r}" for k, v in taken.items()))
    return cfg.model_copy(update={"data": cfg.data.model_copy(update=taken)})


def _columns_of(input_path: str | None, cfg: Config) -> set[str] | None:
    """The columns of the file predict / eval reads, or None when it cannot be opened here (the load reports it)."""
    if input_path is None:
        return None
    try:
        return set(open_rows(input_path, cfg.data).ds.column_names)
    except (UserError, OSError, ValueError):
        return None
