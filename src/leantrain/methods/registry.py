"""The method registry: one ``Task`` per ``model.task``, a record of what the method is (``spec``: its names and
metrics, ``traits``: what it trains on and counts, ``card``: how its model card speaks of it) and of the small parts
it is made of (``parts``: ``leantrain.methods.parts``), so that the engine has no branch on the method and a new
method is one module that calls ``register``.

The parts, each one concern (``task.data``, ``task.model``, ``task.step``, ``task.evaluation``, ``task.prediction``,
``task.report``, made on first use from the classes of the method's ``parts`` record):

- ``data``: the data side it reads with (a modality of ``leantrain.data.modalities``, adapted: labels, collator), its
  checks of the loaded data, how many units a set of examples holds (the engine divides by that count over the global
  batch, known on the host), the columns precomputed once (reference log-probs);
- ``model``: the Auto model class and the config fields it sets (``num_labels``, label maps, ``problem_type``), a new
  head's start, the method bound to the built model (a frozen reference), the memory model's calibration batch;
- ``step``: the training step's seam (``leantrain.methods.seam``): ``batches(ctx, micro_batches, count)`` (as loaded
  by default; an online method generates its own), ``loss(model, batch) -> (loss_sum, step_metrics)``, ``state`` (what
  its steps carry across a resume), and the forward and loss sum they are built from;
- ``evaluation``: what one eval batch gathers, the metrics, the headline, what ``leantrain eval`` loads beside;
- ``prediction``: ``leantrain predict``'s records; ``report``: summary.json, the saved config, card and plan lines.

The run's settings reach a method through ``configured(cfg)`` (a method with settings of its own returns itself with
them), and the keys only a method reads it checks itself (``check_config``). Its names and metric names live in its
``TaskSpec`` (``leantrain.config.tasks``), which the config checks before any work; ``register`` records both.

``model.task=auto`` (``leantrain.methods.detect``): the model's config decides when its model type belongs to exactly
one method's model mapping (a ViT is an image classifier, a wav2vec2 an audio classifier); otherwise
``data.image_column`` / ``data.audio_column`` hint at images or audio; otherwise the text method.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import ClassVar

from leantrain.config.tasks import AUDIO, IMAGE, TEXT, TEXT_REGRESSION, TaskSpec, register_spec, task_spec  # noqa: F401
from leantrain.methods.parts import (NOT_MODEL_INPUTS, Data, Evaluation, Model, Parts, Prediction,  # noqa: F401
                                     Report, Step, model_inputs)
from leantrain.methods.traits import Traits


@dataclass(frozen=True)
class CardText:
    """What the model card says of a model of this method: the title's words, the pipeline example's input."""

    title: str  # "text classification": "# <model>, fine-tuned for <title>"
    noun: str  # "text classifier": "A text classifier fine-tuned from ..."
    example: str  # the argument of the pipeline call in the usage section
    variable: str = "classifier"  # the usage section's name of the pipeline: "classifier", "generator"


@dataclass(frozen=True)
class Task:
    """One method: what it is (``spec``, ``traits``, ``card``: fields, never changed after it is made; a configured
    method is a new object) and its parts (``parts``: the classes, bound to this object on first use)."""

    spec: TaskSpec
    traits: Traits  # what it is, declared: what it trains on, its units, what its model loads as
    card: CardText
    parts: ClassVar[Parts] = Parts()

    @property
    def name(self) -> str:
        return self.spec.name

    @cached_property
    def data(self) -> Data:
        return self.parts.data(self)

    @cached_property
    def model(self) -> Model:
        return self.parts.model(self)

    @cached_property
    def step(self) -> Step:
        return self.parts.step(self)

    @cached_property
    def evaluation(self) -> Evaluation:
        return self.parts.evaluation(self)

    @cached_property
    def prediction(self) -> Prediction:
        return self.parts.prediction(self)

    @cached_property
    def report(self) -> Report:
        return self.parts.report(self)

    def with_traits(self, **changes) -> "Task":
        """This method with some traits replaced (those that follow the run's settings: ``keeps_dropout``)."""
        return replace(self, traits=replace(self.traits, **changes))

    def configured(self, cfg, model_config=None) -> "Task":  # noqa: ANN001 - a Config, a transformers config
        """This method with the run's settings (``Config``; multi-label: ``eval.threshold``); with ``model_config``, a
        trained model's config (predict / eval: multi-label reads its stored threshold); itself by default."""
        return self

    def check_config(self, cfg, task: "Task") -> None:  # noqa: ANN001 - a Config
        """Raise a ConfigError (exit 2, naming the key) when the run (``Config``) sets a key this method owns but the
        run's ``task`` does not read (regression: train.loss=huber on a classifier). ``check_config`` runs it for
        every registered method. Nothing by default."""


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
    return get_task(task).model.auto_class()


def modality_of(task: str) -> str:
    """The data modality of a task: which loader, processor and collator its data goes through."""
    return get_task(task).spec.modality


def default_task(modality: str) -> str:
    """The task ``model.task=auto`` picks for data of this modality when the model does not decide."""
    found = [t.name for t in TASKS.values() if modality in t.traits.default_for]
    if not found:
        raise ValueError(f"no task for {modality!r} data")
    return found[0]


def task_for_labels(here: Task, kind: str) -> Task:
    """``here``, or the task of the same modality whose labels are of ``kind`` (``model.task=auto``: float labels
    make a text task a regression), else of the same model class (chosen / rejected pairs make a causal LM a
    preference task and a sequence classifier a reward model)."""
    if here.traits.labels == kind:
        return here
    found = [t for t in TASKS.values() if t.spec.modality == here.spec.modality and t.traits.labels == kind]
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
    found = [t for t in TASKS.values() if t.traits.model_mapping and kind in getattr(modeling_auto, t.traits.model_mapping, {})]
    archs = getattr(config, "architectures", None) or []
    saved_as = [t for t in found if any(a.endswith(t.traits.auto_model.removeprefix("AutoModel")) for a in archs)]
    found = saved_as or found  # a saved BertForTokenClassification is a token classifier, not a text one
    if len(found) > 1:
        found = ([t for t in found if t.spec.problem_type == getattr(config, "problem_type", None)]
                 or [t for t in found if t.traits.default_for])
    return found[0].name if len(found) == 1 else None
