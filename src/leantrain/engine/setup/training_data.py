"""The training data of a run, validated and processed: data checked before the model is loaded, processed once (the main
process first; the others read the cache it wrote). The task picks the data side (its modality's: text, image,
audio, adapted by the task); what the engine gets back is the same for all: datasets with ``length``, collators,
label names, the processor, and the task that counts the loss's units."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from accelerate import Accelerator

from leantrain.data.caches import using_cache_dir
from leantrain.config import Config
from leantrain.config.metric_names import check_metric
from leantrain.config.training import parse_stop_when
from leantrain.errors import ConfigError, problems_error
from leantrain.data.loaders import eval_loader
from leantrain.data.lm import masks
from leantrain.engine.evaluation.eval_plan import eval_width
from leantrain.engine.setup.precompute import with_precomputed
from leantrain.engine.evaluation.samples import check_sample_prompts
from leantrain.modeling import load_processor, model_name
from leantrain.modeling.positions import model_position_limit
from leantrain.methods import Task, check_config, resolve_task_reason, task_for_labels

log = logging.getLogger("leantrain")


@dataclass
class TrainingData:
    """What the engine trains on, the same for every task: processed datasets, collators, labels, processor."""

    train: object  # datasets.Dataset, processed: model inputs (or file paths), labels, length
    eval: object
    label_names: list[str]
    processor: object  # tokenizer, image processor or feature extractor; saved with the model
    collator: object  # training batches (with augmentation, where configured)
    model_name: str
    columns: dict = field(default_factory=dict)
    eval_batch_size: int | None = None
    num_workers: int = 0
    registered: Task | None = None  # the run's task as registered; ``task``: the one form the run uses
    eval_collator: object | None = None  # unset: the training collator
    token_lengths: np.ndarray | None = None  # tokens per training example (text only)
    config: object | None = None  # the run's Config: Task.configured reads its settings (eval.threshold)
    _task: Task | None = field(default=None, repr=False)  # ``task``, made once

    @property
    def task(self) -> Task:
        """The run's task in the one form everything uses: the registered task configured with the run's settings,
        as the method for this data (``Task.data.for_data``), set for the training data (``Task.data.for_training``), with
        class weights its weighted form; bound to the model by ``bind_model``."""
        if self._task is None:
            task = self.registered.configured(self.config) if self.config is not None else self.registered
            task = task.data.for_data(self.columns).data.for_training(lambda: self.train["labels"], self.label_names)
            self._task = task.data.with_processor(self.processor)
        return self._task

    def bind_model(self, model, accelerator: Accelerator, batch_size: int) -> None:
        """Before training, with the model as it starts: the task bound to it (``Task.model.bind``: a frozen copy
        where the task keeps one) and the task's precomputed columns added to both splits (``engine.precompute``:
        the reference log-probs, computed once and cached on disk)."""
        task = self.task.model.bind(model, accelerator.autocast)  # the policy's precision context
        self._task = task
        splits = [ds for ds in (self.train, self.eval) if ds is not None]
        if not any(task.data.precomputed_columns(list(ds.column_names)) for ds in splits):
            return
        if not getattr(model, "is_loaded_in_4bit", False):  # a 4-bit model is on its GPU already
            model.to(accelerator.device)
        collator = self.eval_collator or self.collator
        self.train = with_precomputed(task, model, self.train, collator, accelerator, batch_size, "train data")
        self.eval = with_precomputed(task, model, self.eval, collator, accelerator, batch_size, "eval data")

    def units_in(self, indices) -> int:
        """The task's loss units (examples, labels, tokens) in these training examples: the loss's denominator."""
        return self.task.data.count(self.train, indices)

    def tokens_in(self, indices) -> int | None:
        """Tokens of these training examples that tokens/s counts: the task's (causal LM: its target tokens), else
        the non-padding input tokens; None when the inputs are not tokens."""
        counted = self.task.data.throughput_tokens(self.train, indices)
        if counted is not None:
            return counted
        return int(self.token_lengths[indices].sum()) if self.token_lengths is not None else None

    def eval_width(self, micro_batch_size: int) -> int:
        """Rows a process evaluates at once (``engine.eval_plan.eval_width``), recorded with the model for eval."""
        return eval_width(self.eval_batch_size, micro_batch_size)

    def eval_loader(self, micro_batch_size: int):
        return eval_loader(self.eval, self.eval_width(micro_batch_size),
                           self.eval_collator or self.collator, num_workers=self.num_workers)



def run_task(cfg: Config) -> Task:
    """``model.task``, or what ``auto`` decides from the model (``resolve_task``) and then from the training labels
    (numbers that are not all whole: the modality's score task, e.g. text-regression)."""
    return run_task_reason(cfg)[0]


def run_task_reason(cfg: Config) -> tuple[Task, str]:
    """``run_task`` and why ``model.task=auto`` chose it ("" when set). Reads the model's config.json (under auto):
    a run resolves its task once (``engine.run_description``) and passes the Task on."""
    task, why = resolve_task_reason(cfg)
    if cfg.model.task != "auto":
        return task, why
    labelled = task_for_labels(task, task.data.side().label_kind(cfg.data))
    return labelled, why if labelled is task else f"{why}, and the labels"


def load_data(cfg: Config, task: Task):
    """The run's data loaded and validated by the task's data side (no model, no processor): raises DataError
    listing every problem."""
    with using_cache_dir(cfg.data.cache_dir):
        # the method as configured reads its data (GRPO's environment opens each row's episode)
        return task.configured(cfg).data.side().load_and_validate(cfg.data, seed=cfg.train.seed,
                                                                  batch_size=cfg.train.batch_size)


def validate_data(cfg: Config):
    """The run's data loaded and checked, with the keys that depend on its task (``check_task_keys``) and the checks
    the data needs (``check_loaded_data``): what ``describe_run`` checks of the data, without the model's checks."""
    task = run_task(cfg)
    check_task_keys(cfg, task)
    data = load_data(cfg, task)
    check_loaded_data(cfg, task, data)
    return data


def check_task_keys(cfg: Config, task: Task) -> None:
    """The keys that only some tasks take, against the run's task (exit 2 naming the key): model.tokenizer (a causal
    LM from a config), report.sample_prompts, each task's own keys (``Task.check_config``: the regression keys,
    preference.*, train.pos_weight)."""
    task.model.check_keys(cfg.model)
    check_sample_prompts(cfg, task)
    check_config(cfg, task)


def check_loaded_data(cfg: Config, task: Task, data) -> None:  # noqa: ANN001 - PreparedData
    """The settings the loaded ``data`` can contradict: the task's training settings (``Task.data.for_training``:
    train.class_weights against the labels, pos_weight), its data check (e.g. preference.loss=kto on pairs, and the
    keys of the method the data selects), the metric ``train.stop_when`` names (eval.mcc: 2 classes)."""
    configured = task.configured(cfg)
    configured.data.for_training(lambda: data.train["label"], data.label_names)  # class weights, pos_weight
    configured.data.check(data.columns, cfg)  # and the keys of the method the data selects (loss=auto)
    # loaded once, when a check needs it, quietly: the run's own load says what it chose (the pad token)
    tokenizer = functools.cache(lambda: load_processor(cfg.model, task, say=False))
    check_rendered_rows(data, tokenizer)
    check_generation_room(cfg, task, configured, data, tokenizer)
    check_stop_when(cfg, len(data.label_names), task)


def check_rendered_rows(data, tokenizer: Callable) -> None:  # noqa: ANN001 - PreparedData
    """The first training rows as the model will see them (``PreparedData.rendered``: instruction, preference and
    prompt data, rendered with the run's tokenizer, ``tokenizer()``), checked by ``data.lm.masks``: a reply with no
    token to learn, or whose trained tokens miss the end-of-turn, or a prompt that does not end with the opening of
    the assistant's turn, is a DataError naming the file, the row and the template."""
    if data.rendered is None:
        return
    tok = tokenizer()
    found = masks.problems(data.rendered(tok, masks.FIRST_ROWS), tok)
    if found:
        raise problems_error(found, [masks.HINT])


def check_generation_room(cfg: Config, task: Task, configured: Task, data,  # noqa: ANN001 - PreparedData
                          tokenizer: Callable | None = None) -> None:
    """A method that generates after its prompts (``Task.data.generated_tokens``, GRPO's ``grpo.max_new_tokens``): each
    prompt, as it will be cut, with that many new tokens within the model's positions, or a DataError naming the
    file, the lines and the numbers (``PreparedData.room``: the data side renders the prompts, with the run's
    tokenizer, only when its prompt budget and the new tokens do not fit together)."""
    wanted = configured.data.generated_tokens()
    if wanted is None or data.room is None:
        return
    limit = model_position_limit(cfg)
    if limit is None:
        return
    problems = data.room(tokenizer or (lambda: load_processor(cfg.model, task, say=False)), wanted[0], limit, wanted[1])
    if problems:
        raise problems_error(problems)


def check_stop_when(cfg, num_labels: int, task: Task | None = None) -> None:  # noqa: ANN001
    """train.stop_when must name a metric evaluation reports for ``task`` (unset: the run's) with ``num_labels``
    classes (mcc: 2 only)."""
    task = (task or run_task(cfg)).name
    for key, value in (("train.stop_when", cfg.train.stop_when), ("checkpoint.best_metric", cfg.checkpoint.best_metric)):
        if value is None:
            continue
        name = parse_stop_when(value)[0] if key == "train.stop_when" else value.removeprefix("eval.")
        try:
            check_metric(name, num_labels, task)
        except ValueError as e:
            raise ConfigError(f"{key}={value}: {e}") from None


def prepare_training_data(cfg: Config, accelerator: Accelerator, run=None) -> TrainingData:  # noqa: ANN001
    """The processor loaded, the data processed and cached, the collators built. ``run`` (a ``RunDescription``):
    the task and the data as the run was described and checked; its data, when it holds it (one process), is used
    as is; else it is loaded here, the main process first, and checked unless the description says it was (the
    workers of ``leantrain train --nproc``). Without ``run`` (``leantrain plan``) the task is resolved and its keys
    and the data checked here."""
    if run is None:
        task, why = run_task_reason(cfg)
        check_task_keys(cfg, task)
        data, checked = None, False
    else:
        task, why, data, checked = run.task, run.task_reason, run.take_data(), run.data_checked
    if data is None:
        with accelerator.main_process_first():
            data = load_data(cfg, task)
            if not checked:  # before the model: e.g. preference.loss=kto on pairs
                check_loaded_data(cfg, task, data)
    log.info("task: %s%s", task.name, f" (model.task=auto: {why})" if why else "")
    for note in data.notes:
        log.info(note)
    for warning in data.warnings:
        log.warning("warning: %s", warning)
    name = model_name(cfg.model) if not (cfg.model.config or cfg.model.config_type) else \
        f"{cfg.model.config or cfg.model.config_type} (from config)"
    modality = task.data.side()
    processor = load_processor(cfg.model, task)
    with accelerator.main_process_first():
        train = modality.process(data.train, processor, cfg.data, desc="Processing train")
        evals = modality.process(data.eval, processor, cfg.data, desc="Processing eval")
    log.info("data: %s", modality.describe(train, evals, data.label_names))
    device = accelerator.device.type
    collator = modality.collator(processor, cfg.data, train=True, seed=cfg.train.seed, device_type=device)
    eval_collator = modality.collator(processor, cfg.data, train=False, seed=cfg.train.seed, device_type=device)
    tokens = np.asarray(train["length"]) if modality.counts_tokens else None
    prepared = TrainingData(train, evals, data.label_names, processor, collator, name, data.columns,
                            cfg.train.eval_batch_size, cfg.data.num_workers, registered=task,
                            eval_collator=eval_collator, token_lengths=tokens, config=cfg)
    for key, weights in prepared.task.report.summary(data.label_names).items():  # class weights, pos_weight, resolved
        if isinstance(weights, list):
            log.info("%s: %s", key.replace("_", " "), ", ".join(f"{w['label']}={w['weight']:.4g}" for w in weights))
    return prepared
