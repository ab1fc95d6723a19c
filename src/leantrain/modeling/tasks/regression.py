"""Text regression (``model.task=text-regression``; single texts or sentence pairs): one score per example, read
as a float (``data.label_column``; numbers that are not all whole make ``model.task=auto`` choose it), squared
error summed over the examples (the engine divides by the global example count), Pearson / Spearman / MSE / MAE.
The saved model has ``problem_type="regression"`` and one output named ``score``:
``pipeline("text-classification", function_to_apply="none")`` returns it; ``leantrain predict`` writes
{"score": ...}."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch

from leantrain.config.tasks import TEXT_REGRESSION, task_spec
from leantrain.modeling.tasks.registry import CardText, Task, register


def squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Squared error per example, in fp32 whatever the autocast dtype."""
    return (outputs.float().squeeze(-1) - targets.float()).square()


def regression_metrics(preds: np.ndarray, targets: np.ndarray) -> dict:
    from scipy.stats import pearsonr, spearmanr

    err = preds - targets
    constant = len(preds) < 2 or np.ptp(preds) == 0 or np.ptp(targets) == 0  # correlation undefined: 0
    mse = float(np.mean(err ** 2))
    return {"pearson": 0.0 if constant else float(pearsonr(preds, targets)[0]),
            "spearman": 0.0 if constant else float(spearmanr(preds, targets)[0]),
            "mse": mse, "mae": float(np.mean(np.abs(err))), "loss": mse, "samples": int(len(preds))}


class Regression(Task):
    """One score per example."""

    def model_fields(self, label_names: list[str]) -> dict:
        return dict(num_labels=1, problem_type=self.spec.problem_type, id2label={0: "score"}, label2id={"score": 0})

    def data_side(self, side):
        return dataclasses.replace(side, load_and_validate=functools.partial(side.load_and_validate, labels="scores"),
                                   load_rows=functools.partial(side.load_rows, labels="scores"))

    def loss_sum(self, outputs, batch: dict) -> torch.Tensor:
        return (squared_error(outputs.logits, batch["labels"]) * batch["loss_weight"]).sum()

    def eval_batch(self, logits: torch.Tensor, labels: torch.Tensor) -> dict:
        return {"preds": logits.float().squeeze(-1), "labels": labels.float()}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        return regression_metrics(values["preds"].astype(np.float64), values["labels"].astype(np.float64))

    def predictions(self, logits: torch.Tensor, label_names: list[str]) -> list[dict]:
        return [{"score": round(v, 6)} for v in logits.float().squeeze(-1).tolist()]

    def headline(self, ev: dict) -> str:
        return f"eval pearson: {ev['pearson']:.4f}  spearman: {ev['spearman']:.4f}  mse: {ev['mse']:.4f}"


TEXT_REGRESSION_TASK = register(Regression(
    task_spec(TEXT_REGRESSION), "AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "tokenizer", CardText("text regression", "text regression model",
                          '"A plane is taking off.", function_to_apply="none"')))
