"""The step's loss normalisation: accumulation and padding examples change nothing."""

import copy

import numpy as np
import pytest
import torch

from leantrain.data.batching import split_global_batch
from leantrain.data.text import TextCollator
from leantrain.engine.training.step import train_step
from leantrain.methods import TEXT, get_task


@pytest.fixture(scope="module")
def setup(tiny_bert):
    from accelerate import Accelerator
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=3)
    rng = np.random.default_rng(0)
    rows = [{"input_ids": [101] + rng.integers(1000, 2000, size=int(n)).tolist() + [102],
             "attention_mask": [1] * (int(n) + 2), "labels": int(rng.integers(0, 3))}
            for n in rng.integers(1, 30, size=10)]  # uneven lengths
    return Accelerator(cpu=True), model, rows


def _run(accelerator, model, rows, parts, steps=2):
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    collate = TextCollator(0)
    losses = []
    for _ in range(steps):
        micro = []
        for idx in split_global_batch(np.arange(len(rows)), parts):
            picked = [dict(rows[i if i >= 0 else -1 - i], loss_weight=0.0 if i < 0 else 1.0) for i in idx]
            micro.append(collate(picked))
        loss_sum, norm = train_step(model, micro, global_count=len(rows), task=get_task(TEXT), accelerator=accelerator,
                                    optimizer=opt, scheduler=sched, max_grad_norm=1.0)
        losses.append(loss_sum.item() / len(rows))
    return model, losses


def test_accumulation_equals_one_big_batch(setup):
    accelerator, model, rows = setup
    big, big_losses = _run(accelerator, model, rows, parts=1)
    for parts in (4, 10, 13):  # 13 parts of 10 rows: three padding examples with weight 0
        acc, acc_losses = _run(accelerator, model, rows, parts=parts)
        np.testing.assert_allclose(acc_losses, big_losses, rtol=1e-5)
        for (name, a), b in zip(acc.named_parameters(), big.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_the_step_changes_the_parameters(setup):
    accelerator, model, rows = setup
    trained, _ = _run(accelerator, model, rows, parts=2)
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), model.parameters()))


def test_collator_pads_per_batch_and_to_max_length():
    rows = [{"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1], "labels": 0},
            {"input_ids": [4], "attention_mask": [1], "labels": 1, "loss_weight": 0.0}]
    out = TextCollator(pad_token_id=9)(rows)
    assert out["input_ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["loss_weight"].tolist() == [1.0, 0.0]
    assert TextCollator(0, pad_to=8)(rows)["input_ids"].shape == (2, 8)
    assert TextCollator(0, multiple_of=4)(rows)["input_ids"].shape == (2, 4)
