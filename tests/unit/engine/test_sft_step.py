"""The step on instruction data with masked prompts: 1 x accumulation 4 == 2 x 2 == 4 x 1 == one big batch
(in-process: the micro-batches of every rank of a step, run one after the other, are the same computation; the
launcher's 2 x 2 is tests/integration/test_sft.py), unpacked and packed."""

from __future__ import annotations

import copy

import datasets
import numpy as np
import pytest
import torch

from leantrain.data.lm import instructions as ins
from leantrain.data.batching import split_global_batch
from leantrain.engine.training.step import train_step
from leantrain.methods import get_task
from tests.helpers import CHATML, make_tiny_chat_tokenizer, make_tiny_llama

QA = [("What is 2 + 2?", "The answer is 4."), ("Hello", "Hello world."),
      ("Give three tips for staying healthy. " * 3, "Eat well."), ("Once upon a time", "there was a small model that "
      "learned to answer questions about the weather, numbers, colours and animals."), ("What?", "Numbers."),
      ("Hello world. Once upon a time there was a small model.", "It learned."), ("Numbers?", "2 + 2 = 4"),
      ("Colours and animals", "The weather is red.")]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("sft-step")
    tok_dir = make_tiny_chat_tokenizer(root / "tok", chat_template=CHATML)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    model = AutoModelForCausalLM.from_pretrained(make_tiny_llama(root / "model", tok_dir), use_cache=False)
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in QA]
    ds = ins.process(datasets.Dataset.from_list(rows), tok, block_size=64).dataset
    return Accelerator(cpu=True), model, tok, ds


def collate(rows: list[dict], pad_id: int) -> dict:
    """The contract's collator: pad ids / -100 labels, positions continuing; a mask only without restarts."""
    width = max(len(r["input_ids"]) for r in rows)
    out = {"input_ids": torch.full((len(rows), width), pad_id), "labels": torch.full((len(rows), width), -100),
           "loss_weight": torch.tensor([r["loss_weight"] for r in rows])}
    packed = "position_ids" in rows[0]
    if packed:
        out["position_ids"] = torch.stack([torch.arange(width)] * len(rows))
    else:
        out["attention_mask"] = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        out["input_ids"][i, :n], out["labels"][i, :n] = torch.tensor(r["input_ids"]), torch.tensor(r["labels"])
        if packed:
            last = r["position_ids"][-1]
            out["position_ids"][i, :n] = torch.tensor(r["position_ids"])
            out["position_ids"][i, n:] = torch.arange(last + 1, last + 1 + width - n)
        else:
            out["attention_mask"][i, :n] = 1
    return out


def run(accelerator, model, ds, parts: int, pad_id: int, steps: int = 2):
    model = copy.deepcopy(model)
    task = get_task("causal-lm")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # Adam would magnify float noise in near-zero gradients
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    rows = list(ds)
    losses = []
    for _ in range(steps):
        batch = np.arange(len(rows))
        count = task.data.count(ds, batch)
        micro = [collate([dict(rows[i if i >= 0 else -1 - i], loss_weight=0.0 if i < 0 else 1.0) for i in idx], pad_id)
                 for idx in split_global_batch(batch, parts)]
        loss_sum, _ = train_step(model, micro, global_count=count, task=task, accelerator=accelerator, optimizer=opt,
                                 scheduler=sched, max_grad_norm=1.0)
        losses.append(loss_sum.item() / count)
    return model, losses


@pytest.mark.parametrize("packed", [False, True])
def test_masked_prompts_1x4_equals_2x2_equals_4x1(setup, packed):
    accelerator, model, tok, ds = setup
    if packed:
        ds = ins.pack(ds, 64).dataset
    assert len(set(ds["targets"])) > 1  # rows hold different numbers of targets
    big, big_losses = run(accelerator, model, ds, 1, tok.eos_token_id)
    # 1x4, 2x2 and 4x1 all cut the global batch into 4 micro-batches (rank-major); one part more than rows: a
    # padding row with weight 0
    for parts in (4, len(ds) + 1):
        acc, acc_losses = run(accelerator, model, ds, parts, tok.eos_token_id)
        np.testing.assert_allclose(acc_losses, big_losses, rtol=1e-5)
        for (name, a), b in zip(acc.named_parameters(), big.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
