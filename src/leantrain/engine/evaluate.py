"""Evaluation: predictions gathered from every process with ``gather_for_metrics`` (padding duplicates dropped),
then loss, accuracy, macro-F1 and, for two classes, MCC over the whole eval set."""

from __future__ import annotations

import numpy as np
import torch

from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

from leantrain.engine.step import model_inputs, per_example_loss
from leantrain.config.metric_names import metric_names


def classification_metrics(preds: np.ndarray, labels: np.ndarray, losses: np.ndarray | None, num_labels: int) -> dict:
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    compute = {  # one entry per name of metric_names(): the config checks train.stop_when against those names
        "accuracy": lambda: accuracy_score(labels, preds),
        "f1_macro": lambda: f1_score(labels, preds, average="macro", labels=list(range(num_labels)), zero_division=0),
        "mcc": lambda: matthews_corrcoef(labels, preds),
        "loss": lambda: losses.mean(),
    }
    out = {name: float(compute[name]()) for name in metric_names(num_labels) if name != "loss" or losses is not None}
    out["samples"] = int(len(labels))
    return out


@torch.no_grad()
def predict_logits(model: nn.Module, loader: DataLoader, accelerator: Accelerator) -> torch.Tensor:
    """Yield gathered (logits, labels-or-None) per batch, for every process's shard, duplicates dropped."""
    was_training = model.training
    model.eval()
    try:
        for batch in loader:
            logits = model(**model_inputs(batch)).logits.float()
            labels = batch.get("labels")
            yield accelerator.gather_for_metrics((logits, labels) if labels is not None else (logits,))
    finally:
        model.train(was_training)


def evaluate(model: nn.Module, loader: DataLoader, accelerator: Accelerator, num_labels: int) -> dict:
    preds, labels, losses = [], [], []
    for logits, y in predict_logits(model, loader, accelerator):
        preds.append(logits.argmax(-1).cpu())
        labels.append(y.cpu())
        losses.append(per_example_loss(logits, y).cpu())
    if not preds:
        return {}
    return classification_metrics(
        torch.cat(preds).numpy(), torch.cat(labels).numpy(), torch.cat(losses).numpy(), num_labels
    )
