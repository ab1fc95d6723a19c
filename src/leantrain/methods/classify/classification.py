"""Single-label classification of texts (single or pairs), images and audio: one label id per example,
cross-entropy summed over the examples (the engine divides by the global example count), accuracy / macro-F1 /
MCC (two classes) / loss, softmax predictions."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.config.metric_names import metric_names
from leantrain.config.tasks import AUDIO, IMAGE, TEXT, task_spec
from leantrain.errors import ConfigError, DataError
from leantrain.methods.parts import Data, Evaluation, Parts, Prediction, Report, Step
from leantrain.methods.registry import CardText, Task, register
from leantrain.methods.traits import Traits


def per_example_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per example, computed in fp32 whatever the autocast dtype."""
    return F.cross_entropy(logits.float(), labels, reduction="none")


def classification_metrics(preds: np.ndarray, labels: np.ndarray, losses: np.ndarray | None, num_labels: int) -> dict:
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    compute = {  # one entry per name of metric_names(): the config checks train.stop_when against those names
        "accuracy": lambda: accuracy_score(labels, preds),
        "f1_macro": lambda: f1_score(labels, preds, average="macro", labels=list(range(num_labels)), zero_division=0),
        "mcc": lambda: matthews_corrcoef(labels, preds),
        "loss": lambda: losses.mean(),
    }
    names = metric_names(num_labels, TEXT)
    out = {name: float(compute[name]()) for name in names if name != "loss" or losses is not None}
    out["samples"] = int(len(labels))
    return out


def recall_per_class(preds: np.ndarray, labels: np.ndarray, label_names: list[str]) -> dict[str, float | None]:
    """{label name: recall} (the share of the class's examples predicted as it); None for a class with no example."""
    out = {}
    for i, name in enumerate(label_names):
        mine = labels == i
        out[name] = float((preds[mine] == i).mean()) if mine.any() else None
    return out


class ClassifyData(Data):
    def for_training(self, labels, label_names: list[str]) -> Task:  # noqa: ANN001 - a callable
        """With class weights, the weighted form for the training ``labels`` (ids; ``balanced`` reads them); a
        UserError (exit 2) for weights the data contradicts."""
        if self.task.class_weights is None:
            return self.task
        weights = resolve_class_weights(self.task.class_weights, label_names, labels)
        return weighted_task(self.task, weights, labels())


class ClassifyStep(Step):
    def loss_sum(self, outputs, batch: dict) -> torch.Tensor:  # noqa: ANN001
        return (per_example_loss(outputs.logits, batch["labels"]) * batch["loss_weight"]).sum()


class ClassifyEvaluation(Evaluation):
    def batch(self, logits: torch.Tensor, labels: torch.Tensor) -> dict:
        return {"preds": logits.argmax(-1), "labels": labels, "losses": per_example_loss(logits, labels)}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        return classification_metrics(values["preds"], values["labels"], values.get("losses"), num_labels)

    def label_metrics(self, values: dict[str, np.ndarray], label_names: list[str]) -> dict:
        return {"recall_per_class": recall_per_class(values["preds"], values["labels"], label_names)}

    def headline(self, ev: dict) -> str:
        return f"eval accuracy: {ev['accuracy']:.4f}  macro-F1: {ev['f1_macro']:.4f}"


class ClassifyPrediction(Prediction):
    def records(self, logits: torch.Tensor, label_names: list[str]) -> list[dict]:
        score, pred = torch.softmax(logits.float(), dim=-1).max(dim=-1)
        return [{"label": label_names[p], "score": round(s, 6)} for p, s in zip(pred.tolist(), score.tolist())]


class ClassifyReport(Report):
    def summary(self, label_names: list[str]) -> dict:
        """summary.json's ``train.class_weights``: null (unweighted)."""
        return {"class_weights": None}


@dataclass(frozen=True)
class Classification(Task):
    """One class per example; with ``train.class_weights`` (``class_weights``: the setting, resolved for the training
    labels by ``data.for_training``) its weighted form (``WeightedClassification``)."""

    class_weights: str | tuple[float, ...] | None = None  # train.class_weights as set: balanced, a weight per label
    parts = Parts(data=ClassifyData, step=ClassifyStep, evaluation=ClassifyEvaluation, prediction=ClassifyPrediction,
                  report=ClassifyReport)

    def configured(self, cfg, model_config=None) -> "Classification":  # noqa: ANN001
        """The run's ``train.class_weights`` (training only: evaluation is unweighted)."""
        if model_config is not None or cfg.train.class_weights is None:
            return self
        weights = cfg.train.class_weights
        return replace(self, class_weights=weights if isinstance(weights, str) else tuple(weights))

    def check_config(self, cfg, task: Task) -> None:  # noqa: ANN001 - a Config
        """train.class_weights is for single-label classification only."""
        if cfg.train.class_weights is not None and not isinstance(task, Classification):
            raise ConfigError(f"train.class_weights is for single-label classification; this run's task is "
                              f"{task.name}")


def classes(auto_model: str, loads_as: str, processor: str, mapping: str, modality: str) -> Traits:
    """A classifier's traits: one class per example, counted in examples and samples/s; the default method of its
    modality's data."""
    return Traits(labels="classes", unit="examples", auto_model=auto_model, loads_as=loads_as, processor=processor,
                  model_mapping=mapping, default_for=(modality,))


TEXT_CLASSIFICATION = register(Classification(
    task_spec(TEXT), classes("AutoModelForSequenceClassification", TEXT, "tokenizer",
                             "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "text"),
    CardText("text classification", "text classifier", '"The delivery was quick and the product works perfectly."')))
IMAGE_CLASSIFICATION = register(Classification(
    task_spec(IMAGE), classes("AutoModelForImageClassification", IMAGE, "image_processor",
                              "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "image"),
    CardText("image classification", "image classifier", '"photo.jpg"')))
AUDIO_CLASSIFICATION = register(Classification(
    task_spec(AUDIO), classes("AutoModelForAudioClassification", AUDIO, "feature_extractor",
                              "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "audio"),
    CardText("audio classification", "audio classifier",
             '{"raw": samples, "sampling_rate": 16000}  # or a file path (needs ffmpeg)')))


# -- class weights (train.class_weights)
# Class weights for single-label classification (``train.class_weights``).
#
# The loss of a global batch is sum_i w[y_i] * CE_i / sum_i w[y_i] over its real examples: torch's weighted mean
# (``F.cross_entropy(weight=w)``). ``WeightedClassification`` gives the engine that: ``step.loss_sum`` weighs each
# example's cross-entropy by its class's weight, ``count`` is the sum of the weights of the examples (a float, on the
# host, from the training labels). Evaluation stays unweighted (``evaluation.batch`` is the plain classification one).


def resolve_class_weights(setting, label_names: list[str], labels) -> list[float]:
    """``train.class_weights`` (``balanced``, or a weight per label) as one weight per label id; ``labels()``: the
    training labels (ids), read for ``balanced``. Raises a UserError (exit 2) for a list of the wrong length, or
    ``balanced`` with a class that has no training example."""
    n = len(label_names)
    if setting == "balanced":
        from sklearn.utils.class_weight import compute_class_weight

        labels = np.asarray(labels(), dtype=np.int64)
        counts = np.bincount(labels, minlength=n)
        missing = [label_names[i] for i in range(n) if counts[i] == 0]
        if missing:
            raise DataError(f"train.class_weights=balanced: no training example of class {', '.join(missing)}; "
                            "give the weights as a list, one per label: " + ", ".join(label_names))
        return [float(w) for w in compute_class_weight("balanced", classes=np.arange(n), y=labels)]
    if len(setting) != n:
        raise ConfigError(f"train.class_weights has {len(setting)} weight{'s' if len(setting) != 1 else ''} but the "
                          f"data has {n} labels: {', '.join(label_names)} (one weight per label, in this order)")
    return [float(w) for w in setting]


class WeightedStep(ClassifyStep):
    """Weight x cross-entropy per example; the weights as a tensor made once per device (a cache of this part)."""

    def __init__(self, task) -> None:  # noqa: ANN001 - a WeightedClassification
        super().__init__(task)
        self.on_device: dict = {}

    def loss_sum(self, outputs, batch: dict) -> torch.Tensor:  # noqa: ANN001
        logits, labels = outputs.logits, batch["labels"]
        w = self.on_device.get(logits.device)
        if w is None:
            w = self.on_device[logits.device] = torch.tensor(self.task.weights, dtype=torch.float32,
                                                             device=logits.device)
        return (per_example_loss(logits, labels) * w[labels] * batch["loss_weight"]).sum()


class WeightedData(ClassifyData):
    def count(self, dataset, indices) -> float:  # noqa: ANN001
        indices = np.asarray(indices, dtype=np.int64)
        return float(self.task.example_weights[indices[indices >= 0]].sum())

    def for_training(self, labels, label_names: list[str]) -> Task:  # noqa: ANN001
        return self.task  # weighted already


class WeightedReport(ClassifyReport):
    def summary(self, label_names: list[str]) -> dict:
        """summary.json's ``train.class_weights``: ``[{"label": name, "weight": w}, ...]`` in label-id order."""
        return {"class_weights": class_weights_record(list(self.task.weights), label_names)}


@dataclass(frozen=True)
class WeightedClassification(Classification):
    """Classification with a weight per class: the loss sums weight x cross-entropy, the count sums the weights."""

    weights: tuple[float, ...] = ()
    example_weights: np.ndarray | None = field(default=None, compare=False, repr=False)  # per training example
    parts = replace(Classification.parts, data=WeightedData, step=WeightedStep, report=WeightedReport)


def weighted_task(task: Task, weights: list[float] | None, train_labels) -> Task:
    """``task`` with class weights (the training ``labels`` give each example its weight), or ``task`` when None."""
    if weights is None:
        return task
    per_class = np.asarray(weights, dtype=np.float64)
    return WeightedClassification(**{f.name: getattr(task, f.name) for f in fields(task)}, weights=tuple(weights),
                                  example_weights=per_class[np.asarray(train_labels, dtype=np.int64)])


def class_weights_record(weights: list[float] | None, label_names: list[str]) -> list[dict] | None:
    """summary.json's ``train.class_weights``: [{"label": name, "weight": w}, ...] in label-id order, or None."""
    return None if weights is None else [{"label": n, "weight": w} for n, w in zip(label_names, weights)]
