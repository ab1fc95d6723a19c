"""The task registry is the seam: a task registered from outside (here a toy regression-like task, in this file)
trains through the unchanged engine, with its own model fields, loss, count, metrics and card lines."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from leantrain.config.tasks import SPECS, TaskSpec
from leantrain.methods import TASKS, CardText, Task, Traits, get_task, register
from leantrain.report.logs import read_metrics
from tests.helpers import word_rows, write_rows

TOY = "toy-score"


class ToyScoreModel(Task.parts.model):
    def fields(self, label_names):
        return {"num_labels": 1, "problem_type": "regression"}


class ToyScoreStep(Task.parts.step):
    def loss_sum(self, outputs, batch):
        err = outputs.logits.float().squeeze(-1) - batch["labels"].float()
        return (err.square() * batch["loss_weight"]).sum()


class ToyScoreEvaluation(Task.parts.evaluation):
    def batch(self, logits, labels):
        return {"err": logits.float().squeeze(-1) - labels.float()}

    def metrics(self, values, num_labels):
        mse = float(np.mean(values["err"] ** 2))
        return {"mse": mse, "loss": mse, "samples": int(len(values["err"]))}


class ToyScorePrediction(Task.parts.prediction):
    def records(self, logits, label_names):
        return [{"score": round(float(v), 6)} for v in logits.float().squeeze(-1)]


class ToyScore(Task):
    """One number per text: the label id as a float target, squared error summed over the examples."""

    parts = replace(Task.parts, model=ToyScoreModel, step=ToyScoreStep, evaluation=ToyScoreEvaluation,
                    prediction=ToyScorePrediction)


@pytest.fixture
def toy_task():
    task = register(ToyScore(TaskSpec(TOY, "text", "regression", ("mse", "loss"), lower_is_better=("mse", "loss")),
                             Traits(labels="classes", unit="examples", auto_model="AutoModelForSequenceClassification",
                                    loads_as="text-classification"),
                             CardText("toy scoring", "toy scorer", '"great lovely"')))
    yield task
    TASKS.pop(TOY, None)
    SPECS.pop(TOY, None)


def test_builtin_tasks_are_registered():
    for name, modality in (("text-classification", "text"), ("image-classification", "image"),
                           ("audio-classification", "audio")):
        task = get_task(name)
        assert task.spec.modality == modality and task.traits.unit == "examples"
        assert task.spec.problem_type == "single_label_classification" and "accuracy" in task.spec.metrics
    with pytest.raises(ValueError, match="unknown task"):
        get_task("nope")


def test_a_registered_task_trains_through_the_engine(tmp_path, tiny_bert, toy_task):
    from leantrain import train

    write_rows(tmp_path / "train.csv", word_rows(16, 0, max_words=8))
    write_rows(tmp_path / "dev.csv", word_rows(8, 1, max_words=8))
    out = tmp_path / "run"
    summary = train(None, [f"model.name={tiny_bert}", f"model.task={TOY}", f"data.train={tmp_path / 'train.csv'}",
                           f"data.eval={tmp_path / 'dev.csv'}", "train.batch_size=8", "train.micro_batch_size=4",
                           "train.max_steps=2", "train.log_every_steps=1", "checkpoint.best_metric=eval.mse",
                           "report.plots=false", "report.progress=none", f"output_dir={out}"])
    assert summary["train"]["steps"] == 2
    assert set(summary["eval"]) == {"mse", "loss", "samples"} and summary["eval"]["samples"] == 8
    losses = [r["loss"] for r in read_metrics(out / "metrics.jsonl") if r["type"] == "train"]
    assert len(losses) == 2 and all(np.isfinite(losses))
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["problem_type"] == "regression" and len(config["id2label"]) == 1  # the task's model fields
    assert json.loads((out / "best" / "best.json").read_text())["mode"] == "min"  # eval.mse: lower is better
    card = (out / "model" / "README.md").read_text()
    assert "fine-tuned for toy scoring" in card and "pipeline_tag: text-classification" in card


def test_a_registered_task_is_a_config_value_and_its_metrics_are_checked(toy_task):
    from leantrain.config import resolve
    from leantrain.engine.setup.training_data import check_stop_when
    from leantrain.errors import ConfigError

    cfg = resolve(None, [f"model.task={TOY}", "train.stop_when=eval.mse<=0.1"])
    check_stop_when(cfg, 2)  # the toy task reports eval.mse
    with pytest.raises(ConfigError, match="eval.mse"):
        check_stop_when(resolve(None, [f"model.task={TOY}", "train.stop_when=eval.accuracy>=0.9"]), 2)
    assert toy_task.data.count(None, [3, 1, 2]) == 3  # units: examples


def test_the_step_asks_the_task_for_its_loss(tiny_bert, toy_task):
    from transformers import AutoModelForSequenceClassification

    from tests.helpers import text_batch

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=1)
    batch = text_batch()
    expected = ((model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.squeeze(-1)
                 - batch["labels"].float()).square() * batch["loss_weight"]).sum()
    loss, outputs = toy_task.step.forward_loss(model, batch)  # what train_step calls: the default forward, then loss_sum
    torch.testing.assert_close(loss, expected)
    assert outputs.logits.shape == (len(batch["labels"]), 1)
