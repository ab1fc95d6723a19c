"""Class weights for single-label classification (``train.class_weights``).

The loss of a global batch is sum_i w[y_i] * CE_i / sum_i w[y_i] over its real examples: torch's weighted mean
(``F.cross_entropy(weight=w)``). ``WeightedClassification`` gives the engine that: ``loss_sum`` weighs each
example's cross-entropy by its class's weight, ``count`` is the sum of the weights of the examples (a float, on the
host, from the training labels). Evaluation stays unweighted (``eval_batch`` is the plain classification one).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch

from leantrain.errors import ConfigError, DataError
from leantrain.modeling.tasks.classification import Classification, per_example_loss
from leantrain.modeling.tasks.registry import Task


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


@dataclass(frozen=True)
class WeightedClassification(Classification):
    """Classification with a weight per class: the loss sums weight x cross-entropy, the count sums the weights."""

    weights: tuple[float, ...] = ()
    example_weights: np.ndarray | None = field(default=None, compare=False, repr=False)  # per training example
    _on_device: dict = field(default_factory=dict, compare=False, repr=False)  # the weights as a tensor, per device

    def loss_sum(self, outputs, batch: dict) -> torch.Tensor:
        logits, labels = outputs.logits, batch["labels"]
        w = self._on_device.get(logits.device)
        if w is None:
            w = self._on_device[logits.device] = torch.tensor(self.weights, dtype=torch.float32, device=logits.device)
        return (per_example_loss(logits, labels) * w[labels] * batch["loss_weight"]).sum()

    def count(self, dataset, indices) -> float:
        indices = np.asarray(indices, dtype=np.int64)
        return float(self.example_weights[indices[indices >= 0]].sum())

    def for_training(self, labels, label_names: list[str]) -> Task:
        return self  # weighted already

    def summary(self, label_names: list[str]) -> dict:
        """summary.json's ``train.class_weights``: ``[{"label": name, "weight": w}, ...]`` in label-id order."""
        return {"class_weights": class_weights_record(list(self.weights), label_names)}


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
