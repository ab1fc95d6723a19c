"""Multi-label classification of texts (``model.task=multi-label``): any number of the label names per example
(``leantrain.data.label_sets``: lists, or strings split at ``data.label_separator``), read as a float multi-hot
vector. Binary cross-entropy with logits per label, in fp32, summed over labels and real examples; the engine
divides by examples x labels of the global batch. Micro / macro F1 and subset accuracy at ``eval.threshold`` (0.5)
on the sigmoid. The saved model has ``problem_type="multi_label_classification"``, so
``pipeline("text-classification", top_k=None)`` returns a sigmoid score per label name; ``leantrain predict``
writes {"labels": [names above the threshold], "scores": {name: sigmoid}}."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.config.tasks import MULTI_LABEL, task_spec
from leantrain.modeling.tasks.registry import CardText, Task, register

THRESHOLD = 0.5  # eval.threshold's default: a label is predicted when its sigmoid is above it


def bce_per_label(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy with logits per (example, label), in fp32 whatever the autocast dtype."""
    return F.binary_cross_entropy_with_logits(logits.float(), targets.float(), reduction="none")


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


@dataclasses.dataclass(frozen=True)
class MultiLabel(Task):
    """A set of labels per example: one sigmoid output per label name, predicted above ``threshold``."""

    threshold: float = THRESHOLD

    def configured(self, cfg) -> "MultiLabel":
        return dataclasses.replace(self, threshold=cfg.eval.threshold)

    def model_fields(self, label_names: list[str]) -> dict:
        return {**super().model_fields(label_names), "problem_type": self.spec.problem_type}

    def data_side(self, side):
        return dataclasses.replace(
            side, load_and_validate=functools.partial(side.load_and_validate, labels="label_sets"),
            load_rows=functools.partial(side.load_rows, labels="label_sets"))

    def loss_sum(self, outputs, batch: dict) -> torch.Tensor:
        return (bce_per_label(outputs.logits, batch["labels"]).sum(-1) * batch["loss_weight"]).sum()

    def count(self, dataset, indices) -> int:
        """Examples x labels: the real examples of ``indices`` (padding indices are negative) times the labels."""
        indices = np.asarray(indices, dtype=np.int64)
        real = indices[indices >= 0]
        return int(len(real) * len(dataset[int(real[0])]["labels"])) if len(real) else 0

    def eval_batch(self, logits: torch.Tensor, labels: torch.Tensor) -> dict:
        return {"probs": torch.sigmoid(logits.float()), "labels": labels.float(),
                "losses": bce_per_label(logits, labels)}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        return multilabel_metrics(values["probs"], values["labels"], values.get("losses"), self.threshold)

    def predictions(self, logits: torch.Tensor, label_names: list[str]) -> list[dict]:
        probs = torch.sigmoid(logits.float()).tolist()
        return [{"labels": [n for n, p in zip(label_names, row) if p > self.threshold],
                 "scores": {n: round(p, 6) for n, p in zip(label_names, row)}} for row in probs]

    def headline(self, ev: dict) -> str:
        return (f"eval micro-F1: {ev['f1_micro']:.4f}  macro-F1: {ev['f1_macro']:.4f}  "
                f"subset accuracy: {ev['subset_accuracy']:.4f}")


MULTI_LABEL_TASK = register(MultiLabel(
    task_spec(MULTI_LABEL), "AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "tokenizer", CardText("multi-label text classification", "multi-label text classifier",
                          '"I love this and it makes me so happy!", top_k=None'), unit="labels"))
