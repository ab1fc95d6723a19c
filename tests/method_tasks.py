"""Test methods for the method seam (``leantrain.methods.seam``), registered by the tests that use them
and by the workers of a multi-process launch (``two_processes_each(..., prelude=...)``):
``from tests.method_tasks import METERED, register_methods``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from leantrain.config.tasks import SPECS, TEXT, task_spec
from leantrain.methods import TASKS, get_task, register
from leantrain.methods.classify.classification import Classification, per_example_loss
from leantrain.methods.seam import StepBatches

METERED = "seam-metered"
TWO_UPDATES = "seam-two-updates"


class MeteredStep(Classification.parts.step):
    def loss(self, model, batch: dict) -> tuple:
        weight = batch["loss_weight"]
        per_row = per_example_loss(self.forward(model, batch).logits, batch["labels"]) * weight
        return per_row.sum(), {"ce": (per_row.detach().sum(), weight.sum()),
                               "label_mean": ((batch["labels"].float() * weight).sum(), weight.sum())}


class Metered(Classification):
    """Text classification reporting two step metrics per micro-batch: its own cross-entropy (the loss again, so its
    logged mean must equal the logged loss) and the label id of its rows (known from the data alone)."""
    parts = replace(Classification.parts, step=MeteredStep)


class TwoUpdatesStep(Classification.parts.step):
    def batches(self, ctx, micro_batches: list[dict], count) -> StepBatches:
        mine = [dict(b, loss_weight=b["loss_weight"] * (1 + b["labels"])) for b in micro_batches]
        weight = torch.stack([b["loss_weight"].sum() for b in mine]).sum()
        inner = ctx.accelerator.unwrap_model(ctx.model)
        self.task.made.append({"step": ctx.step, "count": weight.clone(),
                          "params": {n: p.detach().clone() for n, p in inner.named_parameters()},
                          "batches": [{k: v.clone() for k, v in b.items()} for b in mine]})
        rows = sum(len(b["labels"]) for b in mine)
        return StepBatches(mine, weight, updates=2, tokens=torch.tensor(10.0 * rows), samples=[{"rows": rows}])


class TwoUpdates(Classification):
    """Makes its own micro-batches at each global step: the rows of label 1 weigh twice, the loss's denominator is
    their weight on this process (a device scalar), and two optimizer updates run on them; tokens/s credits 10 tokens
    a made row (a device scalar) and one sample record a step says how many rows it made. Records, per global step,
    the parameters it started from and what it made (``made``: for a test's hand computation, one process)."""

    made: list = []
    parts = replace(Classification.parts, step=TwoUpdatesStep)


def register_methods() -> None:
    """Register both test methods as text classification under their own names (the metered one shows its label
    mean in the progress line)."""
    text = get_task(TEXT)
    metered = replace(text.traits, progress_keys=("loss", "label_mean"))
    for name, kind, traits in ((METERED, Metered, metered), (TWO_UPDATES, TwoUpdates, text.traits)):
        register(kind(replace(task_spec(TEXT), name=name), traits, text.card))


def unregister_methods() -> None:
    for name in (METERED, TWO_UPDATES):
        TASKS.pop(name, None)
        SPECS.pop(name, None)


def label_mean(out: Path, rows: list[dict]) -> float:
    """The mean label id of the training ``rows`` of the run in ``out``, by hand: what Metered logs as label_mean over
    an interval of whole epochs."""
    label2id = json.loads((out / "model" / "config.json").read_text())["label2id"]
    return float(np.mean([label2id[r["label"]] for r in rows]))
