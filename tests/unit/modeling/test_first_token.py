"""The reward model's forward computes a BERT classifier's last layer for the first token only
(``modeling/first_token.py``), and gives the plain model's loss and gradients."""

from __future__ import annotations

import pytest
import torch

from leantrain.config import resolve
from leantrain.modeling.first_token import first_token_last_layer, last_layer
from leantrain.methods import get_task


def tiny_reward_bert(attention: str):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    task = get_task("reward-model").configured(resolve(None, ["model.task=reward-model"]))
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        **task.model.fields([]))
    config._attn_implementation = attention
    return task, BertForSequenceClassification(config).train()


def pair_batch(lengths: list[int], width: int) -> dict:
    """Chosen rows then rejected rows, right-padded to ``width`` (rows shorter than it are masked)."""
    g = torch.Generator().manual_seed(len(lengths) + width)
    ids = torch.randint(2, 64, (len(lengths), width), generator=g)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask, "loss_weight": torch.ones(len(lengths) // 2)}


def loss_and_grads(task, model, batch: dict, first_token: bool) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    if first_token:
        loss, _ = task.step.forward_loss(model, batch)
    else:  # the plain computation: the whole model, every position
        from leantrain.methods.preference import losses as L

        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.squeeze(-1)
        loss = L.bradley_terry(*L.split_pairs(logits.float()), task.center).sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("lengths", [[9, 9, 9, 9], [9, 4, 7, 2, 9, 5]], ids=["full", "padded"])
def test_reward_model_loss_and_gradients_equal_the_plain_forward(attention, lengths):
    task, model = tiny_reward_bert(attention)
    batch = pair_batch(lengths, 9)
    plain_loss, plain = loss_and_grads(task, model, batch, first_token=False)
    loss, grads = loss_and_grads(task, model, batch, first_token=True)
    torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == plain.keys()  # every parameter still gets its gradient (the last layer's too)
    for name, g in plain.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_reward_model_runs_the_last_layer_on_the_first_token_only():
    task, model = tiny_reward_bert("sdpa")
    seen = {}
    for i, layer in enumerate(model.bert.encoder.layer):
        layer.intermediate.dense.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(i, a[0].shape[:2]))
    task.step.forward_loss(model, pair_batch([9, 9, 9, 9], 9))
    assert seen == {0: (4, 9), 1: (4, 1)}  # the first layer on every position, the last on the first one
    model(input_ids=torch.ones(4, 9, dtype=torch.long))  # outside the reward model's forward: the class's own
    assert seen[1] == (4, 9) and "forward" not in vars(last_layer(model))


def test_other_models_run_as_they_are():
    from transformers import BertConfig, BertForTokenClassification

    model = BertForTokenClassification(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                                  num_attention_heads=4, intermediate_size=64))
    assert last_layer(model) is None
    with first_token_last_layer(model):
        assert model(input_ids=torch.ones(2, 5, dtype=torch.long)).logits.shape == (2, 5, 2)
