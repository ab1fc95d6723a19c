"""A reward model (``model.task=reward-model``): a sequence classifier with one output, trained on chosen / rejected
pairs with the Bradley-Terry loss -log sigmoid(r_chosen - r_rejected) (``losses.bradley_terry``), plus
``preference.center_rewards`` x (r_chosen + r_rejected)² when set (reward centring).

Batches (the ``scored-pairs`` data side): ``input_ids`` / ``attention_mask`` ``(2B, T)``, rows 0..B-1 the chosen
(prompt + response), B..2B-1 the rejected; both through one forward. The unit is the pair. Evaluation reports the
pairwise ``accuracy`` (the share of pairs whose chosen scores higher), the mean ``margin`` and the ``loss``.

The saved model is a plain sequence classifier with one output named ``score`` and ``problem_type="regression"``:
``pipeline("text-classification", function_to_apply="none")`` returns the reward of a text, and ``leantrain
predict`` (which reads it as a text-regression model) writes one ``{"score": ...}`` per text.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from leantrain.config.tasks import REWARD_MODEL, task_spec
from leantrain.modeling.fast_paths import FIRST_TOKEN
from leantrain.modeling.first_token import first_token_last_layer
from leantrain.methods.preference import losses as L
from leantrain.methods.preference.preference import check_unread_keys
from leantrain.methods.registry import CardText, Task, register
from leantrain.methods.traits import Traits
from leantrain.modeling.wrappers import unwrapped

MODEL_KEYS = ("input_ids", "attention_mask", "token_type_ids")
RECORD = "reward_model"  # config.json's field: {"center_rewards": ...}


class RewardModelData(Task.parts.data):
    def check(self, columns: dict, cfg=None) -> None:  # noqa: ANN001 - a Config
        """With the run's ``cfg``: the preference.* keys a reward model does not read (``model.task=auto`` may
        choose it from the model and the data only)."""
        if cfg is not None:
            check_unread_keys(cfg, self.task.name)

    def count(self, dataset, indices) -> int:
        return int((np.asarray(indices) >= 0).sum())


class RewardModelModel(Task.parts.model):
    def fields(self, label_names: list[str]) -> dict:
        return dict(num_labels=1, problem_type=self.task.spec.problem_type, id2label={0: "score"}, label2id={"score": 0})


class RewardModelReport(Task.parts.report):
    def saved_config(self, ev: dict | None) -> dict:
        return {RECORD: {"center_rewards": self.task.center}}

    def card_notes(self, model_config: dict) -> list[str]:
        center = (model_config.get(RECORD) or {}).get("center_rewards")
        return ["## Reward model", "", "Trained on chosen / rejected pairs with the Bradley-Terry loss"
                + (f" and reward centring ({center})" if center else "") + ": the one output is the reward of a "
                "text, `pipeline(\"text-classification\", function_to_apply=\"none\")` returns it.", ""]


class RewardModelStep(Task.parts.step):
    def forward_loss(self, model, batch: dict):
        chosen, rejected = self.task.scores(model, L.as_pairs(batch))
        losses = L.bradley_terry(chosen, rejected, self.task.center)
        weight = batch.get("loss_weight")
        weight = torch.ones_like(losses) if weight is None else weight[: losses.shape[0]].to(losses)
        return (losses * weight).sum(), None


class RewardModelEvaluation(Task.parts.evaluation):
    def outputs(self, model, batch: dict) -> tuple:
        chosen, rejected = self.task.scores(model, batch)
        return (torch.stack([chosen, rejected], dim=-1).double(),)

    def batch(self, values: torch.Tensor, labels=None) -> dict:
        return {"chosen": values[:, 0], "rejected": values[:, 1]}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        chosen, rejected = values["chosen"], values["rejected"]
        if not len(chosen):
            return {"loss": math.nan, "samples": 0}
        loss = L.bradley_terry(torch.as_tensor(chosen), torch.as_tensor(rejected), self.task.center)
        return {"accuracy": float((chosen > rejected).mean()), "margin": float((chosen - rejected).mean()),
                "loss": float(loss.mean()), "samples": int(len(chosen))}

    def headline(self, ev: dict) -> str:
        return (f"eval pairwise accuracy: {ev['accuracy']:.4f}  margin: {ev['margin']:.4f}  loss: {ev['loss']:.4f} "
                f"({ev.get('samples', 0)} pairs)")


class RewardModelPrediction(Task.parts.prediction):
    def records(self, logits: torch.Tensor, label_names: list[str]) -> list[dict]:
        return [{"score": round(v, 6)} for v in logits.float().squeeze(-1).tolist()]


@dataclasses.dataclass(frozen=True)
class RewardModel(Task):
    """Pairs -> the Bradley-Terry loss of their two scores, summed; the count of pairs."""

    center: float = 0.0

    parts = dataclasses.replace(Task.parts, data=RewardModelData, model=RewardModelModel, report=RewardModelReport,
                                step=RewardModelStep, evaluation=RewardModelEvaluation,
                                prediction=RewardModelPrediction)

    def configured(self, cfg, model_config=None) -> "RewardModel":
        if model_config is not None:
            return dataclasses.replace(self, center=float((getattr(model_config, RECORD, None) or {})
                                                          .get("center_rewards", 0.0)))
        return dataclasses.replace(self, center=cfg.preference.center_rewards).with_traits(
            keeps_dropout=cfg.preference.dropout == "keep")

    def scores(self, model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) rewards, fp32, from one forward of both halves; a BERT classifier's last layer
        computes only the first token, the one its pooler reads, where the run's connector chose it
        (``modeling/first_token.py``: the same rewards and gradients, about a seventh less work)."""
        with first_token_last_layer(unwrapped(model)):
            logits = model(**{k: batch[k] for k in MODEL_KEYS if k in batch}).logits.float().squeeze(-1)
        return L.split_pairs(logits)


REWARD_MODEL_TASK = register(RewardModel(
    task_spec(REWARD_MODEL),
    Traits(labels="pairs", unit="pairs", auto_model="AutoModelForSequenceClassification",
           loads_as="text-classification", token_blocks=True, headline_loss=True, forward_paths=(FIRST_TOKEN,)),
    CardText("reward modelling", "reward model", '"Human: hi Assistant: hello", function_to_apply="none"')))
