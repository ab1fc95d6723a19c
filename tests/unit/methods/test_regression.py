"""model.task=text-regression: float labels auto-detected, squared error (or Huber) summed / example count, Pearson /
Spearman / MSE / MAE, a saved model with problem_type="regression" that pipeline() and predict read as a score;
standardised targets stored in the model's config, undone by predict / eval."""

from __future__ import annotations

import json

import numpy as np
import pytest

from leantrain.cli import main
from leantrain.config import resolve
from tests.helpers import score_rows, write_rows


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reg")
    return write_rows(tmp / "train.csv", score_rows(48, 0)), write_rows(tmp / "dev.csv", score_rows(12, 1))


def args(tiny_bert, data, out, *extra) -> list[str]:
    train_f, dev_f = data
    return [f"model.name={tiny_bert}", f"data.train={train_f}", f"data.eval={dev_f}", "data.label_column=score",
            "train.batch_size=8", "train.micro_batch_size=4", "train.lr=3e-3", "train.epochs=2", "report.plots=false",
            "report.progress=none", "efficiency.precision=fp32", f"output_dir={out}", *extra]


def test_float_labels_choose_regression_and_whole_ones_classification(tmp_path, tiny_bert, data):
    from leantrain.engine.setup.training_data import run_task

    assert run_task(resolve(None, [f"model.name={tiny_bert}", f"data.train={data[0]}", "data.label_column=score"])
                    ).name == "text-regression"
    whole = write_rows(tmp_path / "w.csv", [{"text": "a b", "score": 1.0}, {"text": "c", "score": 0.0}])
    assert run_task(resolve(None, [f"model.name={tiny_bert}", f"data.train={whole}", "data.label_column=score"])
                    ).name == "text-classification"


def test_regression_metrics():
    from scipy.stats import pearsonr, spearmanr

    from leantrain.config.metric_names import metric_names
    from leantrain.methods.classify.regression import regression_metrics

    p, y = np.array([0.1, 1.2, 2.0, 3.9]), np.array([0.0, 1.0, 2.5, 4.0])
    m = regression_metrics(p, y)
    assert m["pearson"] == pytest.approx(pearsonr(p, y)[0]) and m["spearman"] == pytest.approx(spearmanr(p, y)[0])
    assert m["mse"] == pytest.approx(np.mean((p - y) ** 2)) and m["mae"] == pytest.approx(np.mean(np.abs(p - y)))
    assert [k for k in m if k != "samples"] == metric_names(None, "text-regression")
    assert regression_metrics(np.ones(3), y[:3])["pearson"] == 0.0  # constant predictions: no NaN


def test_train_predict_eval_and_pipeline(tmp_path, tiny_bert, data, capsys):
    from transformers import pipeline

    from leantrain import train

    out = tmp_path / "run"
    summary = train(None, args(tiny_bert, data, out, "checkpoint.best_metric=eval.pearson"))
    ev = summary["eval"]
    assert set(ev) == {"pearson", "spearman", "mse", "mae", "loss", "samples"} and ev["samples"] == 12
    assert ev["loss"] == ev["mse"] and all(np.isfinite(v) for v in ev.values())
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["problem_type"] == "regression" and config["id2label"] == {"0": "score"}
    assert json.loads((out / "model" / "leantrain.json").read_text())["task"] == "text-regression"
    train_f, dev_f = data
    preds = tmp_path / "p.jsonl"
    assert main(["predict", str(out / "model"), "--input", str(dev_f), "--output", str(preds)]) == 0
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    assert len(rows) == 12 and set(rows[0]) == {"row", "text", "score"}
    pipe = pipeline("text-classification", model=str(out / "model"), function_to_apply="none")
    assert pipe(rows[0]["text"])[0]["score"] == pytest.approx(rows[0]["score"], abs=1e-4)
    capsys.readouterr()
    assert main(["eval", str(out / "model"), f"data.eval={dev_f}", "data.label_column=score"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["mse"] == pytest.approx(ev["mse"], rel=1e-4) and shown["pearson"] == pytest.approx(ev["pearson"], abs=2e-3)


def test_explicit_task_and_stop_when_on_a_regression_metric(tiny_bert, data):
    from leantrain.engine.setup.training_data import check_stop_when
    from leantrain.errors import ConfigError

    cfg = resolve(None, args(tiny_bert, data, "unused", "train.stop_when=eval.pearson>=0.9"))
    check_stop_when(cfg, 1)  # auto: the float labels make it regression, which reports eval.pearson
    with pytest.raises(ConfigError, match="eval.accuracy"):
        check_stop_when(resolve(None, args(tiny_bert, data, "unused", "model.task=text-regression",
                                           "train.stop_when=eval.accuracy>=0.9")), 1)


def _task(*overrides: str):
    from leantrain.methods import get_task

    return get_task("text-regression").configured(resolve(None, ["model.task=text-regression", *overrides]))


def test_huber_and_mse_loss_sums():
    import torch
    from types import SimpleNamespace

    out = SimpleNamespace(logits=torch.tensor([[0.0], [1.0], [4.0], [-2.0]]))
    batch = {"labels": torch.tensor([0.5, 1.0, 0.0, 0.0]), "loss_weight": torch.tensor([1.0, 1.0, 1.0, 0.0])}
    err = torch.tensor([-0.5, 0.0, 4.0])  # the padding example (weight 0) counts for nothing
    assert _task().step.loss_sum(out, batch).item() == pytest.approx(float((err ** 2).sum()))
    for delta in (1.0, 2.5):
        quad = err.abs() <= delta
        want = torch.where(quad, 0.5 * err ** 2, delta * (err.abs() - 0.5 * delta)).sum()
        got = _task("train.loss=huber", f"train.huber_delta={delta}").step.loss_sum(out, batch)
        assert got.item() == pytest.approx(want.item())
    assert _task("train.loss=huber").step.loss_sum(out, batch) < _task().step.loss_sum(out, batch)  # the outlier weighs less
    std = _task("data.standardize_targets=true").data.for_training(lambda: [1.0, 3.0], [])  # mean 2, std 1
    assert (std.mean, std.std) == (2.0, 1.0)
    assert std.step.loss_sum(out, batch).item() == pytest.approx(float(((torch.tensor([0.0, 1.0, 4.0]) -
                                                                    torch.tensor([-1.5, -1.0, -2.0])) ** 2).sum()))


def test_regression_keys_refused_for_other_tasks(tiny_bert, tmp_path):
    from leantrain.engine.setup.training_data import validate_data
    from leantrain.errors import ConfigError
    from tests.helpers import word_rows

    f = write_rows(tmp_path / "cls.csv", word_rows(20))
    for key in ("train.loss=huber", "data.standardize_targets=true"):
        with pytest.raises(ConfigError, match=key.split("=")[0] + ".*regression"):
            validate_data(resolve(None, [f"model.name={tiny_bert}", f"data.train={f}", key]))


def test_standardized_targets_stored_and_undone(tmp_path, tiny_bert, data, capsys):
    from transformers import pipeline

    from leantrain import train

    out = tmp_path / "run"
    summary = train(None, args(tiny_bert, data, out, "data.standardize_targets=true", "train.loss=huber"))
    train_f, dev_f = data
    scores = np.array([r["score"] for r in score_rows(48, 0)])
    saved = json.loads((out / "model" / "config.json").read_text())["target_standardization"]
    assert saved["mean"] == pytest.approx(scores.mean()) and saved["std"] == pytest.approx(scores.std())
    assert "standardised" in (out / "model" / "README.md").read_text()
    preds = tmp_path / "p.jsonl"
    assert main(["predict", str(out / "model"), "--input", str(dev_f), "--output", str(preds)]) == 0
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    pipe = pipeline("text-classification", model=str(out / "model"), function_to_apply="none")
    raw = [pipe(r["text"])[0]["score"] for r in rows[:4]]
    for r, z in zip(rows, raw):  # pipeline: the standardised score; predict: the data's scale
        assert r["score"] == pytest.approx(z * saved["std"] + saved["mean"], abs=1e-4)
    assert abs(np.mean([r["score"] for r in rows]) - saved["mean"]) < abs(np.mean(raw) - saved["mean"])
    capsys.readouterr()
    assert main(["eval", str(out / "model"), f"data.eval={dev_f}", "data.label_column=score"]) == 0
    shown = json.loads(capsys.readouterr().out)  # the metrics on the data's scale, as in training
    assert shown["mse"] == pytest.approx(summary["eval"]["mse"], rel=1e-4)
    assert shown["loss"] == pytest.approx(summary["eval"]["loss"], rel=1e-4)
    assert summary["eval"]["loss"] != summary["eval"]["mse"]  # eval.loss: the (standardised) Huber loss
