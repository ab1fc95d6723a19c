"""Text regression (``model.task=text-regression``; single texts or sentence pairs): one score per example, read
as a float (``data.label_column``; numbers that are not all whole make ``model.task=auto`` choose it), squared
error (``train.loss=mse``) or Huber loss (``train.loss=huber``, ``train.huber_delta``) summed over the examples
(the engine divides by the global example count), Pearson / Spearman / MSE / MAE on the data's scale; ``eval.loss``
is the training loss on the eval set.

``data.standardize_targets=true``: the model learns (score - mean) / std, with the mean and std of the training
split, stored in the saved config.json as ``target_standardization: {"mean", "std"}``; metrics, ``leantrain
predict`` and ``leantrain eval`` turn its output back into the data's scale (``output * std + mean``), while
``pipeline()`` returns the standardised output (the model card says so). A loss other than mse is stored too
(``regression_loss: {"name", "delta"}``), so that ``leantrain eval`` reports the same ``eval.loss``.

The saved model has ``problem_type="regression"`` and one output named ``score``:
``pipeline("text-classification", function_to_apply="none")`` returns it; ``leantrain predict`` writes
{"score": ...}."""

from __future__ import annotations

import dataclasses
import functools
import logging

import numpy as np
import torch

from leantrain.config.tasks import TEXT_REGRESSION, task_spec
from leantrain.errors import ConfigError
from leantrain.methods.registry import CardText, Task, register
from leantrain.methods.traits import Traits

log = logging.getLogger("leantrain")
STANDARDIZATION = "target_standardization"  # the model config field: {"mean": ..., "std": ...}
LOSS = "regression_loss"  # the model config field, when not mse: {"name": "huber", "delta": ...}


def squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Squared error per example, in fp32 whatever the autocast dtype."""
    return (outputs.float().squeeze(-1) - targets.float()).square()


def huber_error(outputs: torch.Tensor, targets: torch.Tensor, delta: float) -> torch.Tensor:
    """Huber loss per example (torch's: 0.5 x error² within ``delta``, delta x (|error| - 0.5 delta) beyond), fp32."""
    return torch.nn.functional.huber_loss(outputs.float().squeeze(-1), targets.float(), reduction="none", delta=delta)


def regression_metrics(preds: np.ndarray, targets: np.ndarray, losses: np.ndarray | None = None) -> dict:
    """Pearson, Spearman, MSE, MAE of ``preds`` against ``targets``; ``loss``: the mean of ``losses`` (the
    training loss per example) when given, else the MSE."""
    from scipy.stats import pearsonr, spearmanr

    err = preds - targets
    constant = len(preds) < 2 or np.ptp(preds) == 0 or np.ptp(targets) == 0  # correlation undefined: 0
    mse = float(np.mean(err ** 2))
    return {"pearson": 0.0 if constant else float(pearsonr(preds, targets)[0]),
            "spearman": 0.0 if constant else float(spearmanr(preds, targets)[0]),
            "mse": mse, "mae": float(np.mean(np.abs(err))),
            "loss": mse if losses is None else float(np.mean(losses)), "samples": int(len(preds))}


class RegressionData(Task.parts.data):
    def for_training(self, labels, label_names: list[str]) -> "Regression":
        if not self.task.standardize:
            return self.task
        y = np.asarray(labels(), dtype=np.float64)
        mean, std = (float(y.mean()), float(y.std())) if len(y) else (0.0, 1.0)
        if not std > 0:
            log.warning("data.standardize_targets: every training score is %g; the std is taken as 1", mean)
            std = 1.0
        log.info("scores standardised: (score - %.6g) / %.6g (training split); predictions are turned back", mean, std)
        return dataclasses.replace(self.task, mean=mean, std=std)

    def side(self):  # noqa: ANN201 - a Modality
        side = super().side()
        return dataclasses.replace(side, load_and_validate=functools.partial(side.load_and_validate, labels="scores"),
                                   load_rows=functools.partial(side.load_rows, labels="scores"))


class RegressionReport(Task.parts.report):
    def saved_config(self, ev: dict | None) -> dict:
        fields = {STANDARDIZATION: {"mean": self.task.mean, "std": self.task.std}} if self.task.standardize else {}
        if self.task.loss != "mse":  # eval / predict of the saved model report the loss it was trained with
            fields[LOSS] = {"name": self.task.loss, "delta": self.task.huber_delta}
        return fields

    def card_notes(self, model_config: dict) -> list[str]:
        found = model_config.get(STANDARDIZATION)
        if not found:
            return []
        m, s = found["mean"], found["std"]
        return ["## Scores", "", f"Trained on standardised scores, (score - {m:.6g}) / {s:.6g} (the mean and standard "
                "deviation of the training split, stored in config.json as `target_standardization`). `leantrain "
                "predict` and `leantrain eval` return the data's scale; `pipeline()` returns the standardised "
                f"score: multiply it by {s:.6g} and add {m:.6g}.", ""]


class RegressionModel(Task.parts.model):
    def fields(self, label_names: list[str]) -> dict:
        return dict(num_labels=1, problem_type=self.task.spec.problem_type, id2label={0: "score"},
                    label2id={"score": 0})

    def calibration_labels(self, model, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], device=input_ids.device)  # one score per row


class RegressionStep(Task.parts.step):
    def loss_sum(self, outputs, batch: dict) -> torch.Tensor:
        return (self.task.per_example_loss(outputs.logits, batch["labels"]) * batch["loss_weight"]).sum()


class RegressionEvaluation(Task.parts.evaluation):
    def batch(self, logits: torch.Tensor, labels: torch.Tensor) -> dict:
        values = {"preds": self.task.to_scale(logits), "labels": labels.float()}
        if self.task.loss != "mse" or self.task.standardize:  # else the loss is the MSE, computed from these in float64
            values["losses"] = self.task.per_example_loss(logits, labels)
        return values

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        losses = values.get("losses")
        return regression_metrics(values["preds"].astype(np.float64), values["labels"].astype(np.float64),
                                  None if losses is None else losses.astype(np.float64))

    def headline(self, ev: dict) -> str:
        return f"eval pearson: {ev['pearson']:.4f}  spearman: {ev['spearman']:.4f}  mse: {ev['mse']:.4f}"


class RegressionPrediction(Task.parts.prediction):
    def records(self, logits: torch.Tensor, label_names: list[str]) -> list[dict]:
        return [{"score": round(v, 6)} for v in self.task.to_scale(logits).tolist()]


@dataclasses.dataclass(frozen=True)
class Regression(Task):
    """One score per example; ``loss`` (mse / huber) and the target standardisation come from the run's config
    (``configured``) and its training data (``data.for_training``), or from a saved model's config (``configured`` with
    ``model_config``); ``report.saved_config`` writes them into the saved model's config.json."""

    loss: str = "mse"
    huber_delta: float = 1.0
    standardize: bool = False
    mean: float = 0.0
    std: float = 1.0

    parts = dataclasses.replace(Task.parts, data=RegressionData, report=RegressionReport, model=RegressionModel,
                                step=RegressionStep, evaluation=RegressionEvaluation, prediction=RegressionPrediction)

    def configured(self, cfg, model_config=None) -> "Regression":
        if model_config is not None:  # predict / eval of a trained model: what it was trained with
            found = getattr(model_config, STANDARDIZATION, None)
            loss = getattr(model_config, LOSS, None) or {}
            return dataclasses.replace(self, standardize=bool(found), mean=float(found["mean"]) if found else 0.0,
                                       std=float(found["std"]) if found else 1.0, loss=loss.get("name", "mse"),
                                       huber_delta=float(loss.get("delta", 1.0)))
        return dataclasses.replace(self, loss=cfg.train.loss, huber_delta=cfg.train.huber_delta,
                                   standardize=cfg.data.standardize_targets)

    def check_config(self, cfg, task: Task) -> None:  # noqa: ANN001 - a Config
        """train.loss=huber and data.standardize_targets are for a task with score labels (regression) only."""
        if task.traits.score_labels:
            return
        for key, value, default in (("train.loss", cfg.train.loss, "mse"),
                                    ("data.standardize_targets", cfg.data.standardize_targets, False)):
            if value != default:
                raise ConfigError(f"{key}={str(value).lower()}: for regression (scores) only; this run's task is "
                                  f"{task.name} (model.task=text-regression, or a label column of numbers that are "
                                  "not all whole)")

    def per_example_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The training loss per example, against the (standardised) targets, fp32."""
        targets = (targets.float() - self.mean) / self.std if self.standardize else targets
        if self.loss == "huber":
            return huber_error(outputs, targets, self.huber_delta)
        return squared_error(outputs, targets)

    def to_scale(self, outputs: torch.Tensor) -> torch.Tensor:
        """The model's outputs on the data's scale (undoing the standardisation), fp32, one per example."""
        out = outputs.float().squeeze(-1)
        return out * self.std + self.mean if self.standardize else out


TEXT_REGRESSION_TASK = register(Regression(
    task_spec(TEXT_REGRESSION),
    Traits(labels="scores", unit="examples", auto_model="AutoModelForSequenceClassification",
           loads_as="text-classification", model_mapping="MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    CardText("text regression", "text regression model", '"A plane is taking off.", function_to_apply="none"')))
