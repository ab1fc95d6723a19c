"""The method seam through the real loop: step metrics a method returns beside its loss are logged as exact means over
micro-batches and steps (only at logging steps; over processes: test_tasks_distributed.py, in its shared launch);
batches a method makes, with a device count and two updates each, train exactly as two plain optimizer steps on them."""

from __future__ import annotations

import math

import json
from pathlib import Path

import pytest
import torch
import yaml

from leantrain import train
from leantrain.engine.training.loop_state import LoopState
from leantrain.engine.training.step import add_step_metrics, step_metric_means, train_step
from leantrain.methods import get_task
from leantrain.report.logs import read_metrics
from tests.helpers import YES_NO, model_params, text_batch, word_rows, write_rows
from tests.method_tasks import METERED, TWO_UPDATES, TwoUpdates, label_mean, register_methods, unregister_methods


@pytest.fixture(scope="module")
def methods():
    register_methods()
    yield
    unregister_methods()


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_bert):
    """16 training rows (one epoch: 2 steps of 8), 6 eval rows, fp32; the metered method."""
    tmp = tmp_path_factory.mktemp("seam")
    rows = word_rows(16, 0, max_words=8, words=YES_NO)
    cfg = {"model": {"name": str(tiny_bert), "task": METERED},
           "data": {"train": str(write_rows(tmp / "train.csv", rows)),
                    "eval": str(write_rows(tmp / "eval.csv", word_rows(6, 1, max_words=8, words=YES_NO)))},
           "train": {"batch_size": 8, "micro_batch_size": 2, "epochs": 2, "lr": 1e-3, "log_every_steps": 2,
                     "seed": 3},
           "checkpoint": {"every_steps": 1, "keep": 4},
           "report": {"plots": False, "progress": "plain"},
           "efficiency": {"precision": "fp32"}}
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, tmp, rows


def _train_records(out: Path) -> list[dict]:
    return [r for r in read_metrics(out / "metrics.jsonl") if r["type"] == "train"]


def test_step_metrics_are_logged_as_exact_means_at_logging_steps_only(methods, job, capfd):
    path, tmp, rows = job
    out = tmp / "micro2"
    summary = train(path, [f"output_dir={out}"])
    shown = [line for line in capfd.readouterr().err.splitlines() if line.startswith("step ")]
    assert summary["train"]["steps"] == 4 and summary["train"]["accumulation_steps"] == 4
    records = _train_records(out)
    assert [r["step"] for r in records] == [2, 4]  # log_every_steps=2: nothing written at steps 1 and 3
    for r in records:  # each logged interval is one epoch: every row once, the rows' mean exact
        assert r["label_mean"] == pytest.approx(label_mean(out, rows), rel=1e-6)
        assert r["ce"] == pytest.approx(r["loss"], rel=1e-5)  # the same sum over the same count as the loss
    expected = f"label_mean={label_mean(out, rows):.4g}"
    assert len(shown) == 2 and all(expected in line and "ce=" not in line for line in shown)  # as the method names


def test_the_running_metrics_between_logs_are_device_tensors_in_the_checkpoint(methods, job):
    """At step 3 (not a logging step) the checkpoint holds the running sums as tensors: nothing was read to the host."""
    path, tmp, _ = job
    out = tmp / "micro2"
    if not out.exists():
        train(path, [f"output_dir={out}"])
    from leantrain.engine.checkpoint.state_io import load_state

    step3 = out / "checkpoints" / "step-0000003"
    metrics = load_state(step3, "rank-0")["step_metrics"]
    assert set(metrics) == {"ce", "label_mean"}
    assert all(isinstance(v, torch.Tensor) and v.shape == (2,) for v in metrics.values())
    assert metrics["label_mean"][1].item() == 8  # step 3 alone: its 8 rows since the log at step 2


def test_metrics_change_nothing_in_training(methods, job):
    """The metered method's loss is text classification's: the default seam (no metrics, the batches as loaded, one
    update) and the metered run end bitwise equal, and log the same losses."""
    path, tmp, _ = job
    reference = tmp / "micro2"
    if not reference.exists():
        train(path, [f"output_dir={reference}"])
    out = tmp / "plain"
    train(path, [f"output_dir={out}", "model.task=text-classification"])
    a, b = model_params(reference), model_params(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in _train_records(reference)] == [r["loss"] for r in _train_records(out)]
    assert not {"ce", "label_mean"} & set(_train_records(out)[0])


@pytest.mark.parametrize("micro", [4, 8])
def test_the_logged_metrics_do_not_depend_on_the_accumulation(methods, job, micro):
    path, tmp, _ = job
    reference = tmp / "micro2"
    if not reference.exists():
        train(path, [f"output_dir={reference}"])
    out = tmp / f"micro{micro}"
    summary = train(path, [f"output_dir={out}", f"train.micro_batch_size={micro}"])
    assert summary["train"]["accumulation_steps"] == 8 // micro
    for a, b in zip(_train_records(reference), _train_records(out), strict=True):
        assert a["label_mean"] == b["label_mean"]
        assert a["ce"] == pytest.approx(b["ce"], rel=1e-5)


def test_made_batches_with_a_device_count_and_two_updates_are_two_plain_steps(methods, job, tiny_bert):
    """Two global batches, each made by the method and trained by two updates: the loop takes 4 optimizer steps;
    the weights after each batch equal two plain SGD steps on the made micro-batches over their device count."""
    from transformers import AutoModelForSequenceClassification

    path, tmp, _ = job
    out = tmp / "two-updates"
    TwoUpdates.made.clear()
    lr = 0.5
    summary = train(path, [f"output_dir={out}", f"model.task={TWO_UPDATES}", "train.max_steps=4",
                           "train.micro_batch_size=4", "train.log_every_steps=1", f"train.lr={lr}",
                           "train.max_grad_norm=null", "optim.name=sgd", "optim.momentum=0", "optim.weight_decay=0",
                           "optim.scheduler=constant", "optim.warmup_steps=0", "checkpoint.every_steps=1"])
    assert summary["train"]["steps"] == 4
    made = TwoUpdates.made
    assert [m["step"] for m in made] == [0, 2]  # the hook runs once per global batch, before its two updates
    assert [r["step"] for r in _train_records(out)] == [1, 2, 3, 4]  # every optimizer step logs
    assert [r["epoch"] for r in _train_records(out)] == [0.5, 0.5, 1.0, 1.0]  # the position is the batches'
    trainer = json.loads((out / "checkpoints" / "step-0000002" / "trainer_state.json").read_text())
    assert trainer["step"] == 2 and trainer["extra_updates"] == 1
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000002"]  # never between a batch's
    # two updates (checkpoint.every_steps=1), and none at the last step (as for any run)
    assert summary["train"]["tokens_seen"] == 10 * 16  # the method's tokens (10 a made row), once per global batch
    assert set(summary["train"]["time_split_seconds"]) == {"data", "batches", "compute", "optimizer"}  # its own phase
    assert read_metrics(out / "completions.jsonl") == [{"step": 1, "rows": 8}, {"step": 3, "rows": 8}]  # at the
    # logging step of each batch's first update

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    task = get_task(TWO_UPDATES)
    ends = [made[1]["params"], model_params(out)]
    for m, end in zip(made, ends):
        model.load_state_dict(m["params"], strict=False)
        for _ in range(2):  # two plain SGD steps: p -= lr * d(sum of losses / count)
            model.zero_grad(set_to_none=True)
            (sum(task.step.forward_loss(model, b)[0] for b in m["batches"]) / m["count"]).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.detach(), end[name], rtol=1e-5, atol=1e-6, msg=name)


def test_train_step_adds_the_metrics_on_the_device_without_reading_them(methods, tiny_bert):
    """train_step adds each micro-batch's (sum, count) into the running dict as tensors; reading them happens only in
    ``step_metric_means`` (a logging step)."""
    from accelerate import Accelerator
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    batch = text_batch()
    halves = [{k: v[:3] for k, v in batch.items()}, {k: v[3:] for k, v in batch.items()}]
    running: dict = {}
    accelerator = Accelerator(cpu=True)
    for _ in range(2):
        train_step(model, halves, global_count=6, task=get_task(METERED), accelerator=accelerator, optimizer=opt,
                   scheduler=sched, max_grad_norm=None, metrics=running)
    assert all(isinstance(v, torch.Tensor) and v.device == accelerator.device for v in running.values())
    labels = batch["labels"].float()
    torch.testing.assert_close(running["label_mean"], torch.stack([2 * labels.sum(), torch.tensor(12.0)]))
    assert step_metric_means(running, accelerator)["label_mean"] == pytest.approx(labels.mean().item())


def test_a_peak_metric_keeps_the_largest_value_and_a_mean_the_sum_over_the_count():
    """A name ending in ``_max`` is a peak: the largest value over micro-batches (and processes), NaN when no
    micro-batch counted one; the other names are means."""
    from accelerate import Accelerator

    running: dict = {}
    for value, count in ((2.0, 3.0), (5.0, 1.0), (4.0, 2.0)):
        add_step_metrics(running, {"diff_max": (torch.tensor(value), torch.tensor(count)),
                                   "diff": (torch.tensor(value), torch.tensor(count))})
    add_step_metrics(running, {"none_max": (torch.tensor(7.0), torch.tensor(0.0))})
    means = step_metric_means(running, Accelerator(cpu=True))
    assert means["diff_max"] == 5.0 and means["diff"] == pytest.approx(11.0 / 6.0)
    assert math.isnan(means["none_max"])


def test_step_metrics_and_the_method_state_survive_a_checkpoint(tmp_path):
    """The running sums and the method's own state (here a generator) are saved per process and restored exactly."""
    from leantrain.engine.checkpoint.state_io import load_state, save_state

    class Sampler:
        def __init__(self):
            self.gen = torch.Generator().manual_seed(5)

        def state_dict(self):
            return {"generator": self.gen.get_state()}

        def load_state_dict(self, state):
            self.gen.set_state(state["generator"])

    state = LoopState.fresh(torch.device("cpu"))
    state.step, state.extra_updates = 6, 2
    add_step_metrics(state.metrics, {"reward": (torch.tensor(3.5), torch.tensor(4.0))})
    state.attach_method(Sampler())
    torch.rand(3, generator=state.method.gen)
    saved = state.state_dict()
    save_state(saved["trainer"], tmp_path, "trainer_state")
    save_state(saved["rank"], tmp_path, "rank-0")
    expected = torch.rand(3, generator=state.method.gen)

    back = LoopState.fresh(torch.device("cpu"))
    back.load_state_dict({"trainer": load_state(tmp_path, "trainer_state"), "rank": load_state(tmp_path, "rank-0")},
                         steps_per_epoch=3, device=torch.device("cpu"))
    back.attach_method(Sampler())
    assert (back.step, back.batches, back.epoch, back.start_step) == (6, 4, 1, 1)  # the position is the batches'
    torch.testing.assert_close(back.metrics["reward"], torch.tensor([3.5, 4.0]))
    assert torch.equal(torch.rand(3, generator=back.method.gen), expected)
