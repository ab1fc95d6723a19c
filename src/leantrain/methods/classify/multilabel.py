"""Multi-label classification of texts (``model.task=multi-label``): any number of the label names per example
(``leantrain.data.label_sets``: lists, or strings split at ``data.label_separator``), read as a float multi-hot
vector. Binary cross-entropy with logits per label, in fp32, summed over labels and real examples; the engine
divides by examples x labels of the global batch. Micro / macro F1 and subset accuracy at ``eval.threshold`` (0.5)
on the sigmoid. The saved model has ``problem_type="multi_label_classification"``, so
``pipeline("text-classification", top_k=None)`` returns a sigmoid score per label name; ``leantrain predict``
writes {"labels": [names above the threshold], "scores": {name: sigmoid}}.

``train.pos_weight`` weighs the positive term of each label's BCE (torch's ``pos_weight``); the loss stays divided by
examples x labels, as ``BCEWithLogitsLoss(pos_weight=w)``'s mean is. ``eval.tune_threshold`` (on by default) picks,
at each evaluation, the one threshold that maximises micro-F1 on the eval data; the metrics are reported at it
(``eval.threshold`` in the metrics holds it, ``f1_micro_untuned`` the micro-F1 at the configured threshold) and the
saved model's config.json keeps it as ``threshold`` (``report.saved_config``), which predict / eval then use."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.config.tasks import MULTI_LABEL, task_spec
from leantrain.errors import ConfigError, DataError
from leantrain.modeling.head_start import prior_logits, set_fresh_bias
from leantrain.methods.registry import CardText, Task, register
from leantrain.methods.traits import Traits

THRESHOLD = 0.5  # eval.threshold's default: a label is predicted when its sigmoid is above it
HEAD_LR_FACTOR = 200.0  # the new head's peak lr / train.lr when train.head_lr is unset (head_start; RESULTS.md)
CANDIDATES = np.round(np.arange(0.01, 1.0, 0.01), 2)  # eval.tune_threshold tries these


def bce_per_label(logits: torch.Tensor, targets: torch.Tensor, pos_weight: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """Binary cross-entropy with logits per (example, label), in fp32 whatever the autocast dtype; ``pos_weight``
    (one per label) weighs the positive term, as torch's ``BCEWithLogitsLoss(pos_weight=...)``."""
    return F.binary_cross_entropy_with_logits(logits.float(), targets.float(), reduction="none",
                                              pos_weight=pos_weight)


def resolve_pos_weight(setting, label_names: list[str], labels) -> list[float] | None:
    """``train.pos_weight`` as one weight per label (None when unset): a number for all, a list (checked against
    the labels), or ``balanced`` = negatives / positives of each label over the training ``labels`` (a multi-hot
    array, or a callable returning one). Raises ConfigError / DataError (exit 2)."""
    n = len(label_names)
    if setting is None:
        return None
    if setting == "balanced":
        hot = np.asarray(labels() if callable(labels) else labels, dtype=np.float64).reshape(-1, n)
        pos = hot.sum(0)
        if missing := [label_names[i] for i in range(n) if pos[i] == 0]:
            raise DataError(f"train.pos_weight=balanced: no positive training example of label "
                            f"{', '.join(missing[:10])}; give the weights as a number or a list, one per label")
        return [float(w) for w in (len(hot) - pos) / pos]
    if isinstance(setting, (int, float)):
        return [float(setting)] * n
    if len(setting) != n:
        raise ConfigError(f"train.pos_weight has {len(setting)} weights but the data has {n} labels: "
                          f"{', '.join(label_names[:20])} (one weight per label, in this order, or one number)")
    return [float(w) for w in setting]


def tuned_threshold(probs: np.ndarray, labels: np.ndarray) -> float:
    """The threshold of ``CANDIDATES`` with the best micro-F1 (the lowest of ties)."""
    truth = labels > 0.5
    positives = truth.sum()
    best, best_f1 = THRESHOLD, -1.0
    for t in CANDIDATES:
        pred = probs > t
        tp = np.logical_and(pred, truth).sum()
        f1 = 2 * tp / (pred.sum() + positives) if pred.sum() + positives else 0.0
        if f1 > best_f1 + 1e-12:
            best, best_f1 = float(t), f1
    return best


def f1_per_label(probs: np.ndarray, labels: np.ndarray, label_names: list[str], threshold: float) -> dict:
    """{label name: F1 at ``threshold``}; None for a label with neither a positive nor a prediction."""
    pred, truth = probs > threshold, labels > 0.5
    tp = np.logical_and(pred, truth).sum(0)
    denom = pred.sum(0) + truth.sum(0)
    return {n: (float(2 * tp[i] / denom[i]) if denom[i] else None) for i, n in enumerate(label_names)}


def multilabel_metrics(probs: np.ndarray, labels: np.ndarray, losses: np.ndarray | None,
                       threshold: float = THRESHOLD) -> dict:
    """f1_micro, f1_macro, subset_accuracy (every label right), loss (mean over examples x labels), samples."""
    from sklearn.metrics import accuracy_score, f1_score

    preds = (probs > threshold).astype(np.int64)
    truth = labels.astype(np.int64)
    out = {"f1_micro": float(f1_score(truth, preds, average="micro", zero_division=0)),
           "f1_macro": float(f1_score(truth, preds, average="macro", zero_division=0)),
           "subset_accuracy": float(accuracy_score(truth, preds))}
    if losses is not None:
        out["loss"] = float(losses.mean())
    out["samples"] = int(len(labels))
    return out


class MultiLabelData(Task.parts.data):
    def for_training(self, labels, label_names: list[str]) -> "MultiLabel":
        raw = labels() if callable(labels) else labels  # None: no labels at hand (no prior, pos_weight as set)
        hot = None if raw is None else np.asarray(raw, dtype=np.float64).reshape(-1, len(label_names))
        weights = resolve_pos_weight(self.task.pos_weight_setting, label_names, hot)
        return dataclasses.replace(self.task, num_labels=len(label_names),
                                   pos_weight=None if weights is None else tuple(weights),
                                   prior=None if hot is None else tuple(float(v) for v in prior_logits(hot)))

    def side(self):  # noqa: ANN201 - a Modality
        side = super().side()
        return dataclasses.replace(
            side, load_and_validate=functools.partial(side.load_and_validate, labels="label_sets"),
            load_rows=functools.partial(side.load_rows, labels="label_sets"))

    def count(self, dataset, indices) -> int:
        """Examples x labels: the real examples of ``indices`` (padding indices are negative) times the labels
        (``num_labels``, held since ``data.for_training``; without it, read from one row)."""
        indices = np.asarray(indices, dtype=np.int64)
        real = int((indices >= 0).sum())
        if not real:
            return 0
        width = self.task.num_labels
        if width is None:
            width = len(dataset[int(indices[indices >= 0][0])]["labels"])
        return real * width


class MultiLabelModel(Task.parts.model):
    def start_head(self, model) -> str | None:
        """A fresh head's bias at each label's prior log-odds (``head_start``): training starts at the prior."""
        if self.task.prior is None or not (rows := set_fresh_bias(model, self.task.prior)):
            return None
        return (f"classifier head: bias of {rows} new label rows set to the labels' prior log-odds on the training "
                f"data ({min(self.task.prior):.1f} .. {max(self.task.prior):.1f})")

    def fields(self, label_names: list[str]) -> dict:
        return {**super().fields(label_names), "problem_type": self.task.spec.problem_type}

    def calibration_labels(self, model, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], model.config.num_labels, device=input_ids.device)  # 0/1 per label


class MultiLabelReport(Task.parts.report):
    def summary(self, label_names: list[str]) -> dict:
        return {"pos_weight": None if self.task.pos_weight is None else
                [{"label": n, "weight": w} for n, w in zip(label_names, self.task.pos_weight)]}

    def saved_config(self, ev: dict | None) -> dict:
        return {"threshold": ev["threshold"]} if ev and self.task.tune and "threshold" in ev else {}


class MultiLabelStep(Task.parts.step):
    def __init__(self, task) -> None:  # noqa: ANN001 - a MultiLabel
        super().__init__(task)
        self.on_device: dict = {}  # pos_weight as a tensor, per device

    def weights_on(self, device) -> torch.Tensor | None:  # noqa: ANN001
        if self.task.pos_weight is None:
            return None
        w = self.on_device.get(device)
        if w is None:
            w = self.on_device[device] = torch.tensor(self.task.pos_weight, dtype=torch.float32, device=device)
        return w

    def loss_sum(self, outputs, batch: dict) -> torch.Tensor:
        logits = outputs.logits
        per_label = bce_per_label(logits, batch["labels"], self.weights_on(logits.device))
        return (per_label.sum(-1) * batch["loss_weight"]).sum()


class MultiLabelEvaluation(Task.parts.evaluation):
    def batch(self, logits: torch.Tensor, labels: torch.Tensor) -> dict:
        return {"probs": torch.sigmoid(logits.float()), "labels": labels.float(),
                "losses": bce_per_label(logits, labels)}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        t = self.task.threshold_for(values)
        out = multilabel_metrics(values["probs"], values["labels"], values.get("losses"), t)
        if self.task.tune:
            untuned = multilabel_metrics(values["probs"], values["labels"], None, self.task.threshold)["f1_micro"]
            out.update(threshold=t, f1_micro_untuned=untuned)
        return out

    def label_metrics(self, values: dict[str, np.ndarray], label_names: list[str]) -> dict:
        threshold = self.task.threshold_for(values)
        return {"f1_per_label": f1_per_label(values["probs"], values["labels"], label_names, threshold)}

    def headline(self, ev: dict) -> str:
        return (f"eval micro-F1: {ev['f1_micro']:.4f}  macro-F1: {ev['f1_macro']:.4f}  "
                f"subset accuracy: {ev['subset_accuracy']:.4f}")


class MultiLabelPrediction(Task.parts.prediction):
    def records(self, logits: torch.Tensor, label_names: list[str]) -> list[dict]:
        probs = torch.sigmoid(logits.float()).tolist()
        return [{"labels": [n for n, p in zip(label_names, row) if p > self.task.threshold],
                 "scores": {n: round(p, 6) for n, p in zip(label_names, row)}} for row in probs]


@dataclasses.dataclass(frozen=True)
class MultiLabel(Task):
    """A set of labels per example: one sigmoid output per label name, predicted above ``threshold``."""

    threshold: float = THRESHOLD
    tune: bool = False  # eval.tune_threshold: pick the threshold on the eval data at each evaluation
    pos_weight_setting: object = dataclasses.field(default=None, compare=False)  # train.pos_weight as set
    pos_weight: tuple[float, ...] | None = None  # resolved, one per label (for_training)
    num_labels: int | None = None  # set by for_training: count() reads no row
    prior: tuple[float, ...] | None = None  # each label's prior log-odds on the training data (for_training)

    parts = dataclasses.replace(Task.parts, data=MultiLabelData, model=MultiLabelModel, report=MultiLabelReport,
                                step=MultiLabelStep, evaluation=MultiLabelEvaluation, prediction=MultiLabelPrediction)

    def check_config(self, cfg, task: Task) -> None:  # noqa: ANN001 - a Config
        """``train.pos_weight`` is for multi-label runs: a ConfigError (exit 2) for any other task."""
        if cfg.train.pos_weight is not None and not isinstance(task, MultiLabel):
            raise ConfigError(f"train.pos_weight is for multi-label classification; this run's task is {task.name} "
                              "(single-label classification: train.class_weights)")

    def configured(self, cfg, model_config=None) -> "MultiLabel":
        """The run's settings; with a trained model's config, its stored threshold (unless eval.threshold is set)
        and no tuning (predict / eval on a trained model use the threshold it was saved with)."""
        stored = getattr(model_config, "threshold", None) if model_config is not None else None
        if stored is not None and "threshold" not in cfg.eval.model_fields_set:
            return dataclasses.replace(self, threshold=float(stored), tune=False)
        given = cfg.eval.model_fields_set  # eval.threshold set (and eval.tune_threshold not): that threshold
        tune = cfg.eval.tune_threshold and ("threshold" not in given or "tune_threshold" in given)
        return dataclasses.replace(self, threshold=cfg.eval.threshold, tune=tune and model_config is None,
                                   pos_weight_setting=cfg.train.pos_weight)

    def threshold_for(self, values: dict[str, np.ndarray]) -> float:
        """The threshold the metrics use: tuned on these values (eval.tune_threshold), else the configured one."""
        return tuned_threshold(values["probs"], values["labels"]) if self.tune else self.threshold


MULTI_LABEL_TASK = register(MultiLabel(
    task_spec(MULTI_LABEL),
    Traits(labels="label_sets", unit="labels", auto_model="AutoModelForSequenceClassification",
           loads_as="text-classification", model_mapping="MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
           # model.pooling=auto on the packaged MiniLM: tanh(h_[CLS]) (RESULTS.md)
           head_lr_factor=HEAD_LR_FACTOR, untrained_pooler="cls"),
    CardText("multi-label text classification", "multi-label text classifier",
             '"I love this and it makes me so happy!", top_k=None')))
