"""The task registry: one ``Task`` per ``model.task``, owning everything that differs by task, so that the engine
has no branch on the task and a new task is one file that calls ``register``.

A task owns: the Auto model class and the config fields it sets (``num_labels``, label maps, ``problem_type``),
which processor its inputs need, the data side it reads with (a modality of ``leantrain.data.modalities``, which
``leantrain.engine.setup.training_data`` looks up and hands to ``Task.data_side`` to adapt: labels, collator), the loss
summed over the batch's units and how many units a set of examples holds (the engine divides by that count over
the global batch, known on the host), evaluation (per-batch values, then metrics), predictions, and the model
card's lines.

The seam every training and evaluation path calls (the engine's step and evaluation, the memory model):

- ``Task.forward(model, batch) -> outputs``: the model's forward on a batch (``model(**model_inputs(batch))`` by
  default);
- ``Task.forward_loss(model, batch) -> (loss_sum, outputs)``: the forward and the sum of the batch's per-unit
  losses (an fp32 device tensor; padding units, ``loss_weight`` 0, weigh 0), with what the forward returned (may be
  None: a task whose forward returns no logits says so rather than returning something else under that name);
  ``self.loss_sum(outputs, batch)`` after ``forward`` by default;
- ``Task.eval_outputs(model, batch) -> tuple of tensors``: what one eval batch gathers over the processes (the
  forward happens inside; ``(logits.float(), labels)`` by default), handed to ``eval_batch``;
- ``Task.calibration_labels(model, input_ids)``: the labels of a synthetic batch of these ids (the memory model's
  calibration passes run ``forward_loss`` on it), and ``Task.calibration_batch(batch)`` what else the task's
  batches carry (the preference task's precomputed reference log-probs).

The training step's own seam (``leantrain.methods.seam``): ``Task.step_loss(model, batch) -> (loss_sum,
step_metrics)`` is what the step calls (``forward_loss``'s sum and no metrics by default; a method returns
``{name: (sum, count)}`` device tensors the engine logs as exact means); ``Task.step_batches(ctx, micro_batches,
count)`` makes what a global step trains on (as loaded by default; a method may generate its own, count their units on
the device and run several updates on them); ``Task.step_state`` is what such a method carries across a resume.

A task that needs more than one forward (two sequences per row, a frozen reference) overrides ``forward_loss`` and
``eval_outputs``; the engine does not change. The causal LM's ``token_losses(model, batch)`` (per-token losses of the
shifted targets, through the chunked output layer when installed) is the building block such a task reuses. Its names and metric names live in its ``TaskSpec`` (``leantrain.config.tasks``), which the config
checks before any work; ``register`` records both.

``model.task=auto`` (``leantrain.methods.detect``): the model's config decides when its model type
belongs to exactly one task's model mapping (a ViT is an image classifier, a wav2vec2 an audio classifier);
otherwise ``data.image_column`` / ``data.audio_column`` hint at images or audio; otherwise the text task.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from leantrain.config.tasks import AUDIO, IMAGE, TEXT, TEXT_REGRESSION, TaskSpec, register_spec, task_spec  # noqa: F401
from leantrain.methods.seam import StepBatches, StepContext
from leantrain.methods.traits import Traits

NOT_MODEL_INPUTS = ("labels", "loss_weight", "length")  # batch columns the loss or the batching reads, not the model


def model_inputs(batch: dict) -> dict:
    """The model's keyword arguments of a batch. With ``position_ids`` (packed rows: positions restart per document or
    example) also ``use_cache=False``: transformers builds the block-diagonal mask from restarting positions only when
    there is no cache, and a causal LM's forward makes one by default (config.use_cache), even in training."""
    inputs = {k: v for k, v in batch.items() if k not in NOT_MODEL_INPUTS}
    if "position_ids" in inputs:
        inputs["use_cache"] = False
    return inputs


@dataclass(frozen=True)
class CardText:
    """What the model card says of a model of this task: the title's words, the pipeline example's input."""

    title: str  # "text classification": "# <model>, fine-tuned for <title>"
    noun: str  # "text classifier": "A text classifier fine-tuned from ..."
    example: str  # the argument of the pipeline call in the usage section


@dataclass(frozen=True)
class Task:
    """One task. Subclasses implement the loss, evaluation and predictions; the fields say the rest (what it is:
    ``traits``)."""

    spec: TaskSpec
    traits: Traits  # what it is, declared: what it trains on, its units, what its model loads as (``traits``)
    model_mapping: str | None  # the modeling_auto mapping of model types this class takes (auto-detection), or None
    card: CardText
    default_for: tuple[str, ...] = field(default=())  # modalities whose data picks this task under model.task=auto
    head_lr_factor: float = 1.0  # the classifier head's peak lr / train.lr when train.head_lr is unset (head_start)
    untrained_pooler: str = "pooler"  # what model.pooling=auto does with an untrained-looking BERT pooler (pooling)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def modality(self) -> str:
        return self.spec.modality

    def sequence_length(self, data) -> int:  # noqa: ANN001 - a DataConfig
        """The tokens a row is cut at: ``data.block_size`` for token-block tasks (language models, preference pairs, a
        reward model's pairs), else ``data.max_length``. Recorded with the model as its ``max_length`` (and as its
        saved tokenizer's ``model_max_length``), so that predict, eval and ``pipeline(..., truncation=True)`` cut
        where training did."""
        return data.block_size if self.traits.token_blocks else data.max_length

    def with_traits(self, **changes) -> "Task":
        """This task with some traits replaced (those that follow the run's settings: ``keeps_dropout``)."""
        return replace(self, traits=replace(self.traits, **changes))

    def configured(self, cfg, model_config=None) -> "Task":
        """This task with the run's settings (``Config``; multi-label: ``eval.threshold``); with ``model_config``,
        a trained model's config (predict / eval: multi-label reads its stored threshold); itself by default."""
        return self

    def for_training(self, labels, label_names: list[str]) -> "Task":
        """This task for training on data with these labels (``labels``: a callable returning the training
        labels, read only by a task that needs them; multi-label: ``train.pos_weight=balanced``). Raises a
        UserError for settings the data contradicts (exit 2). Itself by default."""
        return self

    def start_head(self, model) -> str | None:
        """Set a freshly built model's new head before training (multi-label: its bias at the labels' prior);
        returns a line for the log, or None (nothing done, the default)."""
        return None

    def check_data(self, columns: dict, cfg=None) -> None:  # noqa: ANN001 - a Config
        """Raise a UserError (exit 2, before any model loads) for settings the loaded data contradicts (``columns``:
        what the data side detected, e.g. ``{"format": ...}``; preference.loss=kto on pairs); with the run's ``cfg``
        (training) also the keys the method this data selects does not read (preference.loss=auto: kto's on pairs).
        Nothing by default."""

    def generated_tokens(self) -> tuple[int, str] | None:
        """(tokens the method generates after each prompt of its data, the key that sets it): an online method's room
        in the model's positions beside its prompts (``engine.training_data.check_generation_room``); None (it
        generates nothing) by default."""
        return None

    def for_data(self, columns: dict) -> "Task":
        """This task for data the data side described by ``columns`` (the training data's ``format``, or
        ``leantrain eval``'s ``eval_format``): the method that trains on it (preference.loss=auto: KTO on feedback,
        DPO on pairs). Itself by default."""
        return self

    def check_config(self, cfg, task: "Task") -> None:
        """Raise a ConfigError (exit 2, naming the key) when the run (``Config``) sets a key this task owns but the
        run's ``task`` does not read (regression: train.loss=huber on a classifier). ``check_config`` runs it for
        every registered task. Nothing by default."""

    def summary(self, label_names: list[str]) -> dict:
        """Entries of summary.json's ``train`` section (multi-label: ``pos_weight``); none by default."""
        return {}

    def saved_config(self, ev: dict | None) -> dict:
        """Fields the model's config.json gets beyond ``model_fields``: before training (``ev`` None: checkpoints
        carry them; regression: ``target_standardization``) and from the final evaluation ``ev`` (multi-label:
        the tuned ``threshold``); ``configured(cfg, model_config)`` reads them back. None by default."""
        return {}

    # -- model
    def card_notes(self, model_config: dict) -> list[str]:
        """Markdown lines the model card adds for a saved model of this task (its config.json as a dict)."""
        return []

    def model_class(self):
        import transformers  # lazy: heavy

        return getattr(transformers, self.traits.auto_model)

    def model_fields(self, label_names: list[str]) -> dict:
        """The model config fields this task sets for the data's labels (num_labels, label maps, problem_type)."""
        return dict(num_labels=len(label_names), id2label={i: n for i, n in enumerate(label_names)},
                    label2id={n: i for i, n in enumerate(label_names)})

    def scratch_fields(self, processor) -> dict:
        """Config fields of a model built from a config (``model.config`` / ``model.config_type``) that follow its
        processor (causal LM: the tokenizer's vocabulary size and special tokens); none by default."""
        return {}

    # -- data
    def data_side(self, side):
        """The data side (``leantrain.data.modalities.Modality``) this task reads with, built from its modality's:
        as is, or with its own label reading, processing or collator (``dataclasses.replace``)."""
        return side

    # -- training
    def forward(self, model, batch: dict):
        """The model's forward on ``batch``: its outputs (``model(**model_inputs(batch))``)."""
        return model(**model_inputs(batch))

    def forward_loss(self, model, batch: dict) -> tuple:
        """(loss_sum, outputs): the sum of the per-unit losses of ``batch`` (an fp32 device tensor, padding units
        weigh 0) and what the forward returned (may be None). ``forward`` then ``loss_sum`` by default."""
        outputs = self.forward(model, batch)
        return self.loss_sum(outputs, batch), outputs

    def loss_sum(self, outputs, batch: dict):
        """The sum of the per-unit losses of ``batch`` from the forward's ``outputs`` (a device tensor, fp32;
        padding units weigh 0)."""
        raise NotImplementedError

    def calibration_labels(self, model, input_ids):
        """The labels of a synthetic batch of ``input_ids [m, T]`` (the memory model's calibration passes run
        ``forward_loss`` on it): one class per row (0) by default."""
        import torch  # lazy: heavy

        return torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)

    def calibration_batch(self, batch: dict) -> dict:
        """The memory model's synthetic ``batch`` (input ids, attention mask, ``calibration_labels``, weights) with
        what this task's training batches carry beside (the preference task's precomputed reference log-probs, so
        that the passes run no reference forward where training runs none); as it is by default."""
        return batch

    def merge_check_value(self, model, batch: dict):
        """A number of the model alone that merging LoRA into its weights must keep (checked after every merge): the
        loss by default; a task whose loss compares with the adapters switched off (preference) returns the model's
        own log-probs instead."""
        return self.forward_loss(model, batch)[0]

    def count(self, dataset, indices) -> int:
        """How many units the examples ``indices`` of the processed training ``dataset`` hold (on the host)."""
        return len(indices)

    def throughput_tokens(self, dataset, indices) -> int | None:
        """The tokens tokens/s counts in these training examples, or None: the data side's non-padding input
        tokens (causal LM: its target tokens)."""
        return None

    def with_model(self, model, autocast=None) -> "Task":
        """This task bound to the built model, before training and before a resume restores trained weights (the
        preference task's ``live`` reference: a frozen copy made here). ``autocast``: a callable giving the precision
        context the model's forward runs in (the Accelerator's ``autocast``), for the other models a task runs beside
        it. Itself by default."""
        return self

    def reference_model_name(self) -> str | None:
        """A model ``leantrain eval`` loads beside a trained one of this task (the preference task: the reference
        it was tuned against, as recorded), then hands to ``with_reference``; None by default."""
        return None

    def check_evaluable(self) -> None:
        """``leantrain eval``, before any weight or data loads, on the task as the model recorded it
        (``configured(cfg, model_config)``): a UserError when the trained model cannot be evaluated again (a
        preference policy whose reference was never saved); nothing by default."""

    def with_reference(self, model, autocast=None) -> "Task":
        """This task evaluating against ``model`` (frozen), run under ``autocast()`` (the policy's precision context;
        None: as called); itself by default."""
        return self

    def precomputed_columns(self, columns: list[str]) -> tuple[str, ...]:
        """Float columns of a processed dataset (with these ``columns``) that the engine computes once with
        ``precompute`` on the model as it starts training, caches on disk and adds to the rows, so that batches
        carry them (the preference task's reference log-probs); none by default."""
        return ()

    def plan(self, model) -> dict:
        """What ``leantrain plan`` adds for this task and model (the preference task: the memory and time of each
        reference choice); nothing by default."""
        return {}

    def precompute(self, model, batch: dict):
        """The ``precomputed_columns`` of a batch, a ``(rows, columns)`` fp32 tensor (called under no_grad)."""
        raise NotImplementedError

    # the method seam (``leantrain.methods.seam``): the batches a step trains on, its loss and metrics
    def step_loss(self, model, batch: dict) -> tuple:
        """(loss_sum, step_metrics): what the training step calls on each micro-batch. ``step_metrics`` is
        ``{name: (sum, count)}`` of device tensors, the same names at every call, logged as ``sum / count`` over the
        micro-batches, steps and processes since the last log. ``forward_loss``'s sum and no metrics by default."""
        return self.forward_loss(model, batch)[0], {}

    def step_batches(self, ctx: StepContext, micro_batches: list[dict], count) -> StepBatches:
        """What the global step trains on (``ctx``: the model, the Accelerator, the step, ``step_state``'s object),
        given this process's ``micro_batches`` as loaded and the host ``count`` of their units: as loaded, that
        count and one update by default."""
        return StepBatches(micro_batches, count)

    def step_state(self, seed: int, rank: int):
        """An object (``state_dict()`` / ``load_state_dict()``) the method's steps carry across a resume, checkpointed
        per process and handed to ``step_batches`` as ``ctx.state``; None (nothing) by default."""
        return None

    # -- evaluation and prediction
    def eval_outputs(self, model, batch: dict) -> tuple:
        """What one eval batch gathers over the processes (``gather_for_metrics``), then handed to ``eval_batch``;
        the forward happens here (the engine calls this under ``no_grad``): the fp32 logits and the labels by
        default; a task may gather less (causal LM: per-row loss sums and counts)."""
        return self.forward(model, batch).logits.float(), batch["labels"]

    def eval_batch(self, logits, labels) -> dict:
        """Per-unit values of one gathered eval batch (tensors), concatenated over the eval set for ``metrics``."""
        raise NotImplementedError

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        """The eval metrics (the names of ``spec.metrics``) and ``samples`` from the concatenated ``eval_batch``."""
        raise NotImplementedError

    def label_metrics(self, values: dict[str, np.ndarray], label_names: list[str]) -> dict:
        """Per-label values added to the eval metrics, keyed by label name (classification: ``recall_per_class``);
        none by default."""
        return {}

    def all_metrics(self, values: dict[str, np.ndarray], label_names: list[str]) -> dict:
        """``metrics`` and ``label_metrics``: what an evaluation reports."""
        return {**self.metrics(values, len(label_names)), **self.label_metrics(values, label_names)}

    def predictions(self, logits, label_names: list[str]) -> list[dict]:
        """One record per row (``leantrain predict``): e.g. {"label": ..., "score": ...}."""
        raise NotImplementedError

    def row_predictions(self, logits, label_names: list[str], rows, processed) -> list[dict]:
        """``predictions`` for the canonical ``rows`` and their ``processed`` form, in row order (what a task
        that predicts per word needs: token classification); ``predictions(logits)`` by default."""
        return self.predictions(logits, label_names)

    def row_labels(self, rows, processed):
        """The labels of labelled ``rows`` (``leantrain eval``), as ``eval_batch`` takes them with the logits of
        the ``processed`` rows; the canonical ``label`` column by default."""
        import torch  # lazy: heavy

        return torch.as_tensor(np.asarray(rows["label"]))

    def card_rows(self, summary: dict, config: dict) -> list[tuple[str, object]]:
        """(name, value) rows the model card adds under "Training data" (causal LM: corpus, tokens seen, block size,
        perplexity); none by default."""
        return []

    def headline(self, ev: dict) -> str:
        """The eval result in one line, as ``leantrain train`` prints it at the end."""
        return "eval " + "  ".join(f"{k}: {ev[k]:.4f}" for k in self.spec.metrics if k in ev)


TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Add (or replace) a task: ``model.task=<task.name>`` then selects it, and the config knows its metrics."""
    register_spec(task.spec)
    TASKS[task.name] = task
    return task


def check_config(cfg, task: Task) -> None:
    """Every task's keys against the run's ``task`` (``Task.check_config``): a key that only some tasks read, set
    for another, exits 2 naming it."""
    for owner in TASKS.values():
        owner.check_config(cfg, task)


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; registered: {', '.join(TASKS)}") from None


def auto_model_class(task: str):
    return get_task(task).model_class()


def modality_of(task: str) -> str:
    """The data modality of a task: which loader, processor and collator its data goes through."""
    return get_task(task).modality


def default_task(modality: str) -> str:
    """The task ``model.task=auto`` picks for data of this modality when the model does not decide."""
    found = [t.name for t in TASKS.values() if modality in t.default_for]
    if not found:
        raise ValueError(f"no task for {modality!r} data")
    return found[0]


def task_for_labels(here: Task, kind: str) -> Task:
    """``here``, or the task of the same modality whose labels are of ``kind`` (``model.task=auto``: float labels
    make a text task a regression), else of the same model class (chosen / rejected pairs make a causal LM a
    preference task and a sequence classifier a reward model)."""
    if here.traits.labels == kind:
        return here
    found = [t for t in TASKS.values() if t.modality == here.modality and t.traits.labels == kind]
    found = found or [t for t in TASKS.values() if t.traits.auto_model == here.traits.auto_model
                      and t.traits.labels == kind]
    found = found or [t for t in TASKS.values() if t.traits.processor == here.traits.processor
                      and t.traits.labels == kind]
    return found[0] if found else here  # words with tags (a data side of their own) make a text task NER


def task_of_config(config) -> str | None:
    """The one task whose model mapping holds the config's model type, else None (unknown or ambiguous). Several
    tasks share a mapping (text classification and regression): the config's problem_type decides, else the
    modality's default."""
    from transformers.models.auto import modeling_auto  # lazy: heavy

    kind = getattr(config, "model_type", None)
    found = [t for t in TASKS.values() if t.model_mapping and kind in getattr(modeling_auto, t.model_mapping, {})]
    archs = getattr(config, "architectures", None) or []
    saved_as = [t for t in found if any(a.endswith(t.traits.auto_model.removeprefix("AutoModel")) for a in archs)]
    found = saved_as or found  # a saved BertForTokenClassification is a token classifier, not a text one
    if len(found) > 1:
        found = ([t for t in found if t.spec.problem_type == getattr(config, "problem_type", None)]
                 or [t for t in found if t.default_for])
    return found[0].name if len(found) == 1 else None
