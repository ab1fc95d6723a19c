"""KTO is its own method (``methods/preference/kto.py``): chosen by ``preference.loss=kto``, or by ``auto`` on unpaired
feedback; its loss, evaluation and checks on a tiny random Llama; a KTO policy evaluated on pairs is scored as DPO
scores them. (The loss against the hand formula and through the chunked layer: ``test_preference.py``.)"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from leantrain.config import resolve
from leantrain.errors import UserError
from leantrain.methods import get_task
from leantrain.methods.preference.kto import Kto
from leantrain.methods.preference.preference import Preference
from tests.tiny_models import tiny_llama

IGNORE = -100


def method(loss: str, *extra: str):
    return get_task("preference").configured(resolve(None, [f"preference.loss={loss}", *extra]))


def feedback_batch(ref_logps: torch.Tensor) -> dict:
    """Two feedback rows (desirable, undesirable) and their KL rows, prompts masked, precomputed reference."""
    ids = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10], [3, 4, 9, 10], [7, 8, 5, 6]])
    labels = ids.clone()
    labels[:, :2] = IGNORE
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels,
            "desirable": torch.tensor([1, 0]), "ref_logps": ref_logps}


@pytest.fixture(scope="module")
def model():
    return tiny_llama().eval()


def row_logps(model, batch: dict) -> torch.Tensor:
    """Each row's summed completion log-probs, the textbook way."""
    logp = torch.log_softmax(model(input_ids=batch["input_ids"]).logits.float()[:, :-1], -1)
    target = batch["labels"][:, 1:]
    return (logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * (target != IGNORE)).sum(-1)


def test_the_loss_or_the_data_selects_kto():
    assert type(method("kto")) is Kto and method("kto").loss == "kto"
    auto = method("auto")
    assert type(auto) is Preference and auto.loss == "auto"
    assert type(auto.data.for_data({"format": "feedback"})) is Kto and auto.method({"format": "feedback"}) == "kto"
    assert type(auto.data.for_data({"format": "explicit"})) is Preference and auto.method({"format": "explicit"}) == "dpo"
    assert method("dpo").data.for_data({"format": "explicit"}) == method("dpo")
    kto = method("kto", "preference.beta=0.3", "preference.dropout=keep")
    assert auto.data.for_data({"format": "feedback"}).data.precomputed_columns([]) == ("ref_logps", "ref_kl_logps")
    assert kto.beta == 0.3 and kto.traits.keeps_dropout and kto.report.saved_config(None)["preference"]["loss"] == "kto"


def test_a_kto_policy_is_evaluated_on_pairs_as_dpo_with_its_settings():
    recorded = SimpleNamespace(preference={"loss": "kto", "beta": 0.3, "reference_model": "base"})
    kto = get_task("preference").configured(resolve(None, []), recorded)
    assert type(kto) is Kto and kto.reference == "live" and kto.evaluation.reference_model_name() == "base"
    kto.data.check({"eval_format": "explicit"})  # a KTO policy may be evaluated on pairs
    on_pairs = kto.data.for_data({"eval_format": "explicit"})
    assert type(on_pairs) is Preference and (on_pairs.loss, on_pairs.beta) == ("dpo", 0.3)
    assert kto.data.for_data({"eval_format": "feedback"}) is kto


def test_kto_refuses_pairs_to_train_on_and_the_pair_losses_refuse_feedback():
    with pytest.raises(UserError, match="preference.loss=kto is for unpaired feedback"):
        method("kto").data.check({"format": "explicit"})
    method("kto").data.check({"format": "feedback"})
    with pytest.raises(UserError, match="data.eval: unpaired feedback"):
        method("dpo").data.check({"eval_format": "feedback"})


def test_loss_and_metrics_of_the_feedback_rows(model):
    task = method("kto", "preference.beta=0.5")
    batch = feedback_batch(torch.tensor([[-9.0, -8.0], [-7.5, -9.5]]))
    with torch.no_grad():
        pol = row_logps(model, batch)
        loss_sum, _ = task.step.forward_loss(model, batch)
        values = task.evaluation.batch(*task.evaluation.outputs(model, batch))
    ref = batch["ref_logps"]
    r, z = pol[:2] - ref[:, 0], (pol[2:] - ref[:, 1]).clamp(min=0)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = (1 - sig(0.5 * float(r[0] - z[0]))) + (1 - sig(0.5 * float(z[1] - r[1])))
    assert loss_sum.item() == pytest.approx(expected, rel=1e-5)
    m = task.evaluation.metrics({k: v.numpy() for k, v in values.items()}, 0)
    assert m["samples"] == 2 and m["loss"] == pytest.approx(expected / 2, rel=1e-5)
    assert m["chosen_reward"] == pytest.approx(0.5 * float(r[0]), rel=1e-5)  # the desirable row's
    assert m["rejected_reward"] == pytest.approx(0.5 * float(r[1]), rel=1e-5)
    assert m["reward_margin"] == pytest.approx(m["chosen_reward"] - m["rejected_reward"])
    assert m["kl"] == pytest.approx(max(0.0, float((pol[2:] - ref[:, 1]).mean())), rel=1e-5, abs=1e-7)
    assert "reward_accuracy" not in m and task.evaluation.headline(m).startswith("eval loss:")


def test_metrics_of_rows_of_one_label_leave_the_other_side_unknown():
    values = {"loss": np.array([0.4, 0.6]), "reward": np.array([0.1, 0.3]), "logps": np.array([-3.0, -5.0]),
              "kl": np.array([-0.2, -0.4]), "desirable": np.array([1.0, 1.0])}
    m = method("kto").evaluation.metrics(values, 0)
    assert m["chosen_reward"] == pytest.approx(0.2) and math.isnan(m["rejected_reward"]) and m["kl"] == 0.0
    assert method("kto").evaluation.metrics({k: v[:0] for k, v in values.items()}, 0)["samples"] == 0
