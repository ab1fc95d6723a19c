"""KTO (``model.task=preference`` with ``preference.loss=kto``, or ``auto`` on feedback data): preference tuning on
unpaired desirable / undesirable feedback (``losses.kto``), the settings and the reference of the
preference family (``preference.Preference``), its own batches, loss, checks and evaluation.

Batches (the ``feedback`` data side): ``input_ids`` / ``attention_mask`` / ``labels`` ``(2B, T)``, rows 0..B-1 the
feedback rows, rows B..2B-1 their KL rows (each prompt with another row's completion), labels -100 on the prompt and
padding; ``desirable (B,)``, the rows' labels; ``ref_logps (B, 2)`` (the row's, its KL row's) when the reference
log-probs were precomputed. The unit is the feedback row.

Evaluation reports TRL's names: the ``kl`` estimate, the rewards and log-probs of the desirable (``chosen_*``) and
undesirable (``rejected_*``) rows, their margin, the loss. A KTO policy evaluated on pairs (``leantrain eval``) is
scored as DPO scores them (``data.for_data``: its rewards are the same log-ratios).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from leantrain.errors import UserError
from leantrain.methods.preference import losses as L
from leantrain.methods.preference.preference import METHODS, Preference, data_format, lm_batch

INPUT_COLUMNS = ("input_ids", "kl_input_ids")  # a feedback row, its KL row
REF_COLUMNS = ("ref_logps", "ref_kl_logps")  # the row's, its KL row's
VALUES = ("loss", "reward", "logps", "kl")


class KtoData(Preference.parts.data):
    def for_data(self, columns: dict) -> Preference:
        """Itself on feedback; on pairs (``leantrain eval`` of a KTO policy) DPO with these settings."""
        return self.task if data_format(columns) in (None, "feedback") else self.task.as_method("dpo")


class KtoEvaluation(Preference.parts.evaluation):
    def outputs(self, model, batch: dict) -> tuple:
        """Per row: its loss, reward, log-prob and KL log-ratio (fp64), and ``desirable`` (its label)."""
        _, values = self.task.pair_values(model, batch)
        return torch.stack([values[k] for k in VALUES], dim=-1).double(), values["desirable"]

    def batch(self, values: torch.Tensor, desirable: torch.Tensor) -> dict:
        return {**{k: values[:, i] for i, k in enumerate(VALUES)}, "desirable": desirable.double()}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        n = len(values["loss"])
        if not n:
            return {"loss": math.nan, "samples": 0}
        good = values["desirable"] > 0.5

        def mean(key: str, rows: np.ndarray) -> float:
            return float(values[key][rows].mean()) if rows.any() else math.nan

        out = {"loss": float(values["loss"].mean()), "samples": int(n), "kl": float(max(0.0, values["kl"].mean())),
               "chosen_reward": mean("reward", good), "rejected_reward": mean("reward", ~good),
               "chosen_logps": mean("logps", good), "rejected_logps": mean("logps", ~good)}
        out["reward_margin"] = out["chosen_reward"] - out["rejected_reward"]
        return out


class Kto(Preference):
    """Feedback rows -> one KTO loss each, summed; the count of rows."""

    ref_columns = REF_COLUMNS
    input_columns = INPUT_COLUMNS

    parts = replace(Preference.parts, data=KtoData, evaluation=KtoEvaluation)

    def check_format(self, columns: dict) -> None:
        """kto reads unpaired feedback: the training data must be feedback (a KTO policy may be evaluated on pairs
        by ``leantrain eval``)."""
        train = columns.get("format")
        if train is not None and train != "feedback":
            raise UserError("preference.loss=kto is for unpaired feedback (prompt / completion / label, or messages / "
                            "label); this data is chosen / rejected pairs: use preference.loss=dpo (or auto)")

    def pair_values(self, model, batch: dict) -> tuple[torch.Tensor, dict]:
        """The per-row losses (B,) and what evaluation reports of them (reward, log-prob, KL log-ratio, label)."""
        logps, _ = L.sequence_logps(self.token_losses(model, lm_batch(batch)), batch["labels"])
        row, kl_row = L.split_pairs(logps)
        ref = self.reference_logps(model, batch)
        good = batch["desirable"].to(row.device)
        losses = L.kto(row, ref[:, 0], kl_row, ref[:, 1], good, self.beta, self.desirable_weight,
                       self.undesirable_weight)
        return losses, {"loss": losses, "reward": self.beta * (row - ref[:, 0]), "logps": row,
                        "kl": kl_row - ref[:, 1], "desirable": good}

    def step_metrics(self, values: dict, weight: torch.Tensor) -> dict:
        """``{name: (sum, count)}``: the mean reward of the desirable rows (``rewards/chosen``) and of the undesirable
        ones (``rewards/rejected``), and the KL log-ratio of the KL rows (``kl``, before KTO's clamp at 0)."""
        good = values["desirable"].to(weight) * weight
        bad = weight - good
        reward, kl = values["reward"].detach(), values["kl"].detach()
        return {"rewards/chosen": ((reward * good).sum(), good.sum()),
                "rewards/rejected": ((reward * bad).sum(), bad.sum()), "kl": ((kl * weight).sum(), weight.sum())}


METHODS["kto"] = Kto
