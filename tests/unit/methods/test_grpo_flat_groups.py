"""Groups whose every advantage is 0 left out of the forward and backward (``flat_groups``, grpo.skip_zero_advantage):
the loss, its gradient and the rollout metrics are those of training every group, on a tiny Llama in fp32."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from leantrain.config.grpo import GrpoConfig
from leantrain.methods import get_task
from leantrain.methods.grpo import flat_groups
from leantrain.methods.grpo import forward as F
from leantrain.methods.grpo import rollout as G
from leantrain.methods.grpo.rewards import Reward

GEN = 3  # completions per prompt
PAD = 0


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1)).eval()


def micro_batch(g: torch.Generator, prompts: int, prompt_width: int, width: int, advantages: list[float]) -> dict:
    """``prompts`` left-padded prompts answered GEN times, completions right-padded to ``width``, the given
    advantages, the sampler's log-probs, rollout values (K = 6: the reward first)."""
    rows = prompts * GEN
    p_len = torch.randint(1, prompt_width + 1, (prompts,), generator=g)
    p_mask = (torch.arange(prompt_width)[None, :] >= prompt_width - p_len[:, None]).long()
    c_len = torch.randint(1, width + 1, (rows,), generator=g)
    c_mask = (torch.arange(width)[None, :] < c_len[:, None]).long()
    ids = torch.randint(2, 40, (rows, width), generator=g).masked_fill(c_mask == 0, PAD)
    values = torch.rand(rows, 6, generator=g)
    return {F.PROMPT_IDS: torch.randint(2, 40, (prompts, prompt_width), generator=g).masked_fill(p_mask == 0, PAD),
            F.PROMPT_MASK: p_mask, F.COMPLETION_IDS: ids, F.COMPLETION_MASK: c_mask,
            F.COMPLETION_LABELS: ids.masked_fill(c_mask == 0, -100), "advantages": torch.tensor(advantages),
            "loss_weight": torch.ones(rows), "rollout_values": values,
            G.SAMPLER_LOGPS: (-torch.rand(rows, width, generator=g) * 3).masked_fill(c_mask == 0, 0.0)}


def step(made: list[dict]) -> list[dict]:
    """Three micro-batches of 2 prompts, of other prompt and completion widths: 3 of the 6 groups learn."""
    g = torch.Generator().manual_seed(0)
    return [micro_batch(g, 2, 4, 5, [0.0, 0.0, 0.0, 1.2, -0.4, -0.8]),  # group 0 flat
            micro_batch(g, 2, 6, 3, [0.0] * 6),  # both flat
            micro_batch(g, 2, 3, 7, [0.5, -0.5, 0.0, 0.9, -0.3, -0.6])]


def task(**keys):  # noqa: ANN201 - a Grpo
    return dataclasses.replace(get_task("grpo"), grpo=GrpoConfig(**keys),
                               rewards=(Reward("r", None), ))


def loss_and_grads(grpo, llama, batches: list[dict], count: float) -> tuple[float, dict, list[torch.Tensor]]:
    """The engine's step (``train_step``) without the optimizer: the loss sums over ``count``, their gradient, and
    the step metrics summed over the micro-batches."""
    llama.zero_grad(set_to_none=True)
    total, metrics = 0.0, {}
    for b in batches:
        loss, m = grpo.step.loss(llama, b)
        (loss / count).backward()
        total += loss.item() / count
        for k, (s, c) in m.items():
            metrics[k] = metrics.get(k, 0) + torch.stack([s.float(), torch.as_tensor(c, dtype=torch.float32)])
    return total, metrics, [p.grad.clone() for p in llama.parameters()]


def count(batches: list[dict]) -> float:
    from leantrain.methods.grpo import losses as L
    from leantrain.methods.grpo.grpo import completion_mask

    return float(sum(L.count(completion_mask(b), b["loss_weight"], "dapo", 8) for b in batches))


def test_flat_groups_left_out_give_the_loss_gradient_and_rollout_metrics_of_training_them_all(llama):
    grpo = task(epsilon=0.2)
    made = step([])
    n = count(made)
    whole, metrics, grads = loss_and_grads(grpo, llama, made, n)
    trained = flat_groups.trained(made, GEN, PAD, None)
    assert len(trained) == 2 and [b[F.PROMPT_IDS].shape[0] for b in trained] == [2, 1]  # 3 groups, 2 a micro-batch
    assert sum(b[F.COMPLETION_IDS].shape[0] for b in trained) == 9  # of 18 rows
    got, got_metrics, got_grads = loss_and_grads(grpo, llama, trained, n)
    assert whole != 0 and got == pytest.approx(whole, rel=1e-5)
    for a, b in zip(got_grads, grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for name in G.metric_names(list(grpo.rewards)):  # every row's rollout values, counted once
        torch.testing.assert_close(got_metrics[name], metrics[name])
    # the forward's token metrics are over the trained groups' completion tokens only
    trained_tokens = sum(int(b[F.COMPLETION_MASK].sum()) for b in trained)
    assert float(got_metrics["clip_ratio"][1]) == trained_tokens < float(metrics["clip_ratio"][1])


def test_a_trained_group_keeps_its_rows_prompt_and_completion_with_padding_around_them():
    made = step([])
    first = flat_groups.trained(made, GEN, PAD, None)[0]  # groups (0, 1) and (2, 0): widths 4 and 3, 5 and 7
    assert first[F.PROMPT_IDS].shape == (2, 4) and first[F.COMPLETION_IDS].shape == (6, 7)
    src = made[2]
    assert torch.equal(first[F.PROMPT_IDS][1, 1:], src[F.PROMPT_IDS][0])  # left-padded
    assert first[F.PROMPT_MASK][1, 0] == 0 and first[F.PROMPT_IDS][1, 0] == PAD
    assert torch.equal(first[F.COMPLETION_IDS][:3, :5], made[0][F.COMPLETION_IDS][3:6])  # right-padded
    assert (first[F.COMPLETION_IDS][:3, 5:] == PAD).all() and (first[F.COMPLETION_LABELS][:3, 5:] == -100).all()
    assert (first[F.COMPLETION_MASK][:3, 5:] == 0).all() and (first[G.SAMPLER_LOGPS][:3, 5:] == 0).all()
    assert first["advantages"].tolist() == pytest.approx([1.2, -0.4, -0.8, 0.5, -0.5, 0.0])
    assert torch.equal(first["rollout_values"], torch.cat([b["rollout_values"] for b in made]))
    assert torch.equal(first[flat_groups.ROLLOUT_WEIGHTS], torch.ones(18))


def test_with_no_group_to_learn_one_token_weighing_nothing_keeps_the_step_and_every_gradient_is_zero(llama):
    g = torch.Generator().manual_seed(3)
    made = [micro_batch(g, 2, 4, 5, [0.0] * 6), micro_batch(g, 2, 4, 5, [0.0] * 6)]
    trained = flat_groups.trained(made, GEN, PAD, None)
    assert len(trained) == 1 and (trained[0]["loss_weight"] == 0).all()
    one = trained[0]
    assert torch.equal(one[F.PROMPT_IDS], made[0][F.PROMPT_IDS][:1])  # the first flat group's prompt, whole
    assert torch.equal(one[F.COMPLETION_IDS], made[0][F.COMPLETION_IDS][:1, :1])  # its first row's first token
    loss, metrics, grads = loss_and_grads(task(), llama, trained, count(made))
    assert loss == 0 and len(grads) == len(list(llama.parameters()))  # every weight gets its gradient: 0
    assert all((gr == 0).all() for gr in grads)
    assert float(metrics["reward"][1]) == 12  # every row's reward still counted
    assert float(metrics["clip_ratio"][1]) == 0  # no trained token


def test_every_group_learning_leaves_the_micro_batches_as_they_are():
    g = torch.Generator().manual_seed(4)
    made = [micro_batch(g, 2, 4, 5, [1.0, -1.0, 0.0, 0.0, 0.0, 0.5])]
    assert flat_groups.trained(made, GEN, PAD, None) is made


def test_a_row_whose_weight_is_not_finite_still_reaches_the_loss():
    g = torch.Generator().manual_seed(5)
    b = micro_batch(g, 2, 4, 5, [0.0] * 6)
    b["loss_weight"] = torch.tensor([float("nan"), 1, 1, 0, 0, 0])
    assert flat_groups.learning(b, GEN).tolist() == [True, False]


@pytest.mark.parametrize("keys, skips", [
    ({}, True), ({"loss": "grpo"}, True), ({"loss": "dr_grpo"}, True), ({"num_iterations": 2}, True),
    ({"beta": 0.04}, False),  # the KL term's gradient does not vanish at advantage 0
    ({"loss": "bnpo"}, False),  # each micro-batch's token mean: the rows in it change the value
    ({"skip_zero_advantage": "off"}, False)])
def test_groups_are_skipped_only_where_that_changes_nothing_but_rounding(keys, skips):
    assert flat_groups.skips(GrpoConfig(**keys)) is skips
