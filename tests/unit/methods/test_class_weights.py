"""train.class_weights (single-label classification): the weighted loss is torch's weighted mean, ``balanced`` is
sklearn's, a wrong-length list exits 2 before any work, and eval reports the recall of each class."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import write_rows
from leantrain.cli import main
from leantrain.methods import TEXT, get_task
from leantrain.methods.classify.classification import resolve_class_weights, weighted_task


def test_weighted_loss_sum_over_count_is_torchs_weighted_mean():
    g = torch.Generator().manual_seed(0)
    labels = np.array([0, 2, 2, 1, 0, 2, 2, 2, 1, 0])  # the training labels; the batch is examples 2..8
    w = [0.5, 3.0, 1.25]
    task = weighted_task(get_task(TEXT), w, labels)
    indices = np.arange(2, 9)
    logits = torch.randn(len(indices) + 1, 3, generator=g)  # + one padding example (loss_weight 0)
    y = torch.as_tensor(np.append(labels[indices], 1))
    batch = {"labels": y, "loss_weight": torch.tensor([1.0] * len(indices) + [0.0])}
    loss = task.step.loss_sum(SimpleNamespace(logits=logits), batch) / task.data.count(None, indices)
    want = F.cross_entropy(logits[:-1], y[:-1], weight=torch.tensor(w))
    assert abs(loss.item() - want.item()) < 1e-6
    assert task.data.count(None, indices) == pytest.approx(float(np.asarray(w)[labels[indices]].sum()))


def test_eval_stays_unweighted():
    logits, y = torch.randn(5, 2), torch.tensor([0, 1, 1, 0, 1])
    plain, weighted = get_task(TEXT), weighted_task(get_task(TEXT), [1.0, 9.0], [0, 1])
    assert torch.equal(plain.evaluation.batch(logits, y)["losses"], weighted.evaluation.batch(logits, y)["losses"])


def test_balanced_weights_are_sklearns():
    from sklearn.utils.class_weight import compute_class_weight

    labels = np.array([0] * 7 + [1] * 2 + [2] * 3)
    got = resolve_class_weights("balanced", ["a", "b", "c"], lambda: labels)
    assert got == pytest.approx(list(compute_class_weight("balanced", classes=np.arange(3), y=labels)), rel=1e-12)


def test_the_classifier_owns_its_class_weights():
    """train.class_weights is the classification method's: ``configured`` takes the setting, ``for_training`` resolves
    it on the training labels into the weighted form, whose summary records the weights; unset, nothing changes."""
    from leantrain.config import resolve

    labels = np.array([0, 0, 0, 1])
    task = get_task(TEXT).configured(resolve(None, ["train.class_weights=balanced"]))
    weighted = task.data.for_training(lambda: labels, ["neg", "pos"])
    assert weighted.report.summary(["neg", "pos"]) == {"class_weights": [{"label": "neg", "weight": pytest.approx(2 / 3)},
                                                                  {"label": "pos", "weight": 2.0}]}
    assert weighted.data.count(None, [0, 3, -1]) == pytest.approx(2 / 3 + 2.0)  # a padding index (-1) weighs nothing
    plain = get_task(TEXT).configured(resolve(None, []))
    assert plain.data.for_training(lambda: labels, ["neg", "pos"]) is plain
    assert plain.report.summary(["neg", "pos"]) == {"class_weights": None}


def test_recall_per_class_by_label_name():
    task = get_task(TEXT)
    values = {"preds": np.array([0, 0, 1, 1, 2]), "labels": np.array([0, 1, 1, 1, 0]), "losses": np.ones(5)}
    out = task.evaluation.all_metrics(values, ["neg", "pos", "meh"])
    assert out["recall_per_class"] == {"neg": 0.5, "pos": pytest.approx(2 / 3), "meh": None}
    assert out["accuracy"] == pytest.approx(0.6) and out["samples"] == 5


def _rows(n_pos: int, n_neg: int) -> list[dict]:
    return [{"text": "great fine", "label": "pos"}] * n_pos + [{"text": "awful bad", "label": "neg"}] * n_neg


def test_wrong_length_exits_2_naming_key_length_and_labels(tmp_path, tiny_bert, capsys):
    data = write_rows(tmp_path / "train.csv", _rows(3, 9))
    rc = main(["train", f"model.name={tiny_bert}", f"data.train={data}", "train.class_weights=[1,2,3]",
               "train.max_steps=1", f"output_dir={tmp_path / 'o'}"])
    err = capsys.readouterr().err
    assert rc == 2 and "train.class_weights" in err and "3 weights" in err and "2 labels: neg, pos" in err, err
    assert not (tmp_path / "o").exists()  # before any work


def test_class_weights_on_a_regression_exit_2(tmp_path, tiny_bert, capsys):
    data = write_rows(tmp_path / "train.csv", [{"text": "a b", "score": 0.5 + i} for i in range(12)])
    rc = main(["train", f"model.name={tiny_bert}", f"data.train={data}", "data.label_column=score",
               "model.task=text-regression", "train.class_weights=balanced", f"output_dir={tmp_path / 'o'}"])
    err = capsys.readouterr().err
    assert rc == 2 and "train.class_weights" in err and "text-regression" in err, err


def test_non_positive_weight_is_a_config_error(capsys):
    assert main(["train", "train.class_weights=[1, -2]", "--print-config"]) == 2
    assert "train.class_weights" in capsys.readouterr().err
