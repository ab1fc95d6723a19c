"""GRPO's losses against hand-computed values (TRL's ``_compute_loss`` / ``_generate_and_score_completions``
semantics) and the layout invariance of the loss and its gradient."""

from __future__ import annotations

import math

import pytest
import torch

from leantrain.methods.grpo import losses as L

NAN = float("nan")


def test_group_advantages_are_the_reward_less_the_group_mean_over_its_std_plus_1e4():
    rewards = torch.tensor([1.0, 0, 0, 0, 2, 2, 2, 2], dtype=torch.float64)
    adv, std = L.advantages(rewards, 4, "group")
    # group 1: mean 0.25, Bessel std sqrt(0.75 / 3) = 0.5; group 2: std 0, so 0 / 1e-4 = 0
    assert adv.tolist() == pytest.approx([0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, 0, 0, 0, 0])
    assert std.tolist() == pytest.approx([0.5] * 4 + [0.0] * 4)


def test_batch_scaling_divides_by_the_std_of_the_whole_batch_and_none_does_not_divide():
    rewards = torch.tensor([1.0, 0, 0, 0, 2, 2, 2, 2], dtype=torch.float64)
    batch_std = math.sqrt((17 - 9 ** 2 / 8) / 7)  # sum 9, sum of squares 17, 8 values: 0.99103
    adv, std = L.advantages(rewards, 4, "batch")
    assert adv[0].item() == pytest.approx(0.75 / (batch_std + 1e-4))
    assert std.tolist() == pytest.approx([batch_std] * 8)
    assert L.std_of(L.moments(rewards)).item() == pytest.approx(batch_std)  # the global std from summed moments
    given, _ = L.advantages(rewards, 4, "batch", batch_std=torch.tensor(2.0))
    assert given[0].item() == pytest.approx(0.75 / 2.0001)
    plain, _ = L.advantages(rewards, 4, "none")
    assert plain.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])


def test_an_unscorable_reward_is_left_out_of_its_group_and_gets_no_advantage():
    adv, std = L.advantages(torch.tensor([1.0, NAN, 0, 0], dtype=torch.float64), 4, "group")
    # mean of 1, 0, 0 = 1/3; std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    assert adv.tolist() == pytest.approx([(2 / 3) / (math.sqrt(1 / 3) + 1e-4), 0.0,
                                          (-1 / 3) / (math.sqrt(1 / 3) + 1e-4), (-1 / 3) / (math.sqrt(1 / 3) + 1e-4)])
    assert std[0].item() == pytest.approx(math.sqrt(1 / 3))
    assert math.isnan(L.nanstd(torch.tensor([1.0, NAN])).item())  # one value has no spread
    assert math.isnan(L.std_of(L.moments(torch.tensor([3.0]))).item())


# RLOO (grpo.advantage=rloo): two groups of 4, the second with an unscorable completion.
#   [1, 0, 0, 1]:     the others' means 1/3, 2/3, 2/3, 1/3 -> 2/3, -2/3, -2/3, 2/3
#   [0.5, 2, NaN, 1]: scored 0.5, 2, 1; the others' means (2 + 1)/2 = 1.5, (0.5 + 1)/2 = 0.75, -, (0.5 + 2)/2 = 1.25
#                     -> -1, 1.25, 0 (unscorable), -0.25
RLOO_REWARDS = torch.tensor([1.0, 0, 0, 1, 0.5, 2, NAN, 1], dtype=torch.float64)
RLOO_CENTRED = [2 / 3, -2 / 3, -2 / 3, 2 / 3, -1.0, 1.25, 0.0, -0.25]
GROUP_STDS = [math.sqrt(1 / 3)] * 4 + [math.sqrt(7 / 12)] * 4  # Bessel: (4 x 0.25) / 3; (4/9 + 25/36 + 1/36) / 2
BATCH_STD = math.sqrt((7.25 - 5.5 ** 2 / 7) / 6)  # the 7 scored rewards: sum 5.5, sum of squares 7.25


@pytest.mark.parametrize("scale, divisors", [
    ("none", [1.0] * 8),
    ("group", [s + 1e-4 for s in GROUP_STDS]),
    ("batch", [BATCH_STD + 1e-4] * 8),
])
def test_rloo_advantages_are_the_reward_less_the_mean_of_the_others_scaled_as_configured(scale, divisors):
    adv, std = L.advantages(RLOO_REWARDS, 4, scale, baseline="rloo")
    assert adv.tolist() == pytest.approx([a / d for a, d in zip(RLOO_CENTRED, divisors)])
    assert std.tolist() == pytest.approx(GROUP_STDS if scale != "batch" else [BATCH_STD] * 8)
    given, _ = L.advantages(RLOO_REWARDS, 4, scale, batch_std=torch.tensor(2.0), baseline="rloo")
    if scale == "batch":  # the global batch's std, all-reduced over processes, when given
        assert given.tolist() == pytest.approx([a / 2.0001 for a in RLOO_CENTRED])


def test_without_unscorable_rows_rloo_is_g_over_g_minus_1_times_the_group_relative_advantage():
    rewards = torch.rand(6 * 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3 - 1
    rloo, _ = L.advantages(rewards, 5, "none", baseline="rloo")
    grpo, _ = L.advantages(rewards, 5, "none")
    assert torch.allclose(rloo, grpo * 5 / 4, rtol=1e-12, atol=1e-12)
    assert torch.allclose(rloo.view(6, 5).sum(1), torch.zeros(6, dtype=torch.float64), atol=1e-12)  # still centred


@pytest.mark.parametrize("scale", ["none", "group", "batch"])
def test_under_rloo_a_row_with_no_other_scored_row_in_its_group_gets_no_advantage(scale):
    rewards = torch.tensor([NAN, 3.0, NAN, NAN, 1.0, 0, NAN, NAN, NAN, NAN, NAN, NAN], dtype=torch.float64)
    adv, _ = L.advantages(rewards, 4, scale, baseline="rloo")
    # group 1: one scored row (nothing to compare it with); group 2: 1 against 0 and back; group 3: none scored
    want = [0.0, 0.0, 0.0, 0.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    if scale == "group":
        want = [a / (math.sqrt(0.5) + 1e-4) for a in want]
    if scale == "batch":
        want = [a / (L.nanstd(rewards).item() + 1e-4) for a in want]
    assert adv.tolist() == pytest.approx(want)
    assert not adv.isnan().any()


def test_the_default_advantage_is_grpo_and_an_unknown_one_is_refused():
    from leantrain.config.grpo import GrpoConfig

    assert GrpoConfig().advantage == "grpo"
    for scale in ("none", "group", "batch"):
        default, _ = L.advantages(RLOO_REWARDS, 4, scale)
        named, _ = L.advantages(RLOO_REWARDS, 4, scale, baseline="grpo")
        assert torch.equal(default, named)
    with pytest.raises(ValueError, match="unknown GRPO advantage 'ppo'"):
        L.advantages(RLOO_REWARDS, 4, "none", baseline="ppo")


def test_the_surrogate_is_clipped_on_the_side_the_advantage_pushes():
    logps = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]])
    old = torch.tensor([[-1.0, -2.5], [-1.0, -1.5]])  # ratios: 1, e^0.5 = 1.6487; 1, e^-0.5 = 0.6065
    loss, clipped = L.surrogate(logps, old, torch.tensor([2.0, -1.0]), 0.2, 0.2)
    # row 0 (A = 2): -min(1.6487 * 2, 1.2 * 2) = -2.4, clipped; row 1 (A = -1): -min(-0.6065, -0.8) = 0.8, clipped
    assert loss.flatten().tolist() == pytest.approx([-2.0, -2.4, 1.0, 0.8])
    assert clipped.tolist() == [[False, True], [False, True]]
    high, clipped = L.surrogate(logps[:1], old[:1], torch.tensor([-1.0]), 0.2, 0.2)
    assert high[0].tolist() == pytest.approx([1.0, math.exp(0.5)]) and not clipped.any()  # A < 0: the ratio is not cut
    wider, clipped = L.surrogate(logps[:1], old[:1], torch.tensor([2.0]), 0.2, 0.7)  # epsilon_high (clip-higher)
    assert wider[0].tolist() == pytest.approx([-2.0, -2 * math.exp(0.5)]) and not clipped.any()


def test_at_the_sampling_policy_the_surrogate_gradient_is_minus_the_advantage():
    logps = torch.tensor([[-1.0, -3.0]], requires_grad=True)
    loss, _ = L.surrogate(logps, logps.detach(), torch.tensor([0.5]), 0.2, 0.2)
    loss.sum().backward()
    assert loss[0].tolist() == pytest.approx([-0.5, -0.5])
    assert logps.grad[0].tolist() == pytest.approx([-0.5, -0.5])


def test_k3_kl_matches_its_formula_and_is_zero_at_the_reference():
    kl = L.kl_k3(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0]))
    assert kl.tolist() == pytest.approx([math.exp(-0.5) + 0.5 - 1, 0.0])  # 0.10653, 0


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 9.0], [7.0, 7.0, 7.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
WEIGHTS = torch.tensor([1.0, 1.0, 0.0])  # the third row is padding


@pytest.mark.parametrize("loss, total, units", [
    ("dapo", 15.0, 5.0),  # (1 + 2 + 3 + 4 + 5) / 5 tokens
    ("grpo", 2.0 + 4.5, 2.0),  # row means 2 and 4.5, over 2 sequences
    ("dr_grpo", 15.0, 8.0),  # 15 / (2 sequences x max_new_tokens 4)
    ("bnpo", 3.0, 1.0),  # the micro-batch's token mean, one micro-batch
])
def test_each_reduction_gives_its_sum_and_count(loss, total, units):
    assert L.reduce(PER_TOKEN, MASK, WEIGHTS, loss).item() == pytest.approx(total)
    assert L.count(MASK, WEIGHTS, loss, max_new_tokens=4).item() == pytest.approx(units)


def test_an_unknown_loss_is_refused():
    with pytest.raises(ValueError, match="unknown GRPO loss 'ppo'"):
        L.reduce(PER_TOKEN, MASK, WEIGHTS, "ppo")


def test_masked_sums_count_the_completion_tokens_of_live_rows():
    total, n = L.masked_sum(PER_TOKEN, MASK, WEIGHTS)
    assert (total.item(), n.item()) == (15.0, 5.0)


def rollout(rows: int = 8, tokens: int = 5, seed: int = 0) -> dict:
    """Rows of two groups with completions of different lengths, a policy that moved from the sampling one."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 1, 3, 2, 4, 5, 2, 1])[:rows]
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).long()
    old = -torch.rand(rows, tokens, generator=g) * 3
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 1], dtype=torch.float64)[:rows]
    return {"logps": old + torch.randn(rows, tokens, generator=g) * 0.3, "old": old, "ref": old - 0.1,
            "mask": mask, "weights": torch.ones(rows), "adv": L.advantages(rewards, 4, "group")[0].float()}


def layout_loss(r: dict, loss: str, chunks: int) -> tuple[float, torch.Tensor]:
    """The loss and its gradient with the rows split into ``chunks`` micro-batches (over processes or accumulation:
    the engine sums their (loss_sum, count) pairs either way)."""
    logps = r["logps"].clone().requires_grad_(True)
    sums, counts = [], []
    for rows in torch.arange(len(logps)).chunk(chunks):
        per_token, _ = L.surrogate(logps[rows], r["old"][rows], r["adv"][rows], 0.2, 0.28)
        per_token = per_token + 0.05 * L.kl_k3(logps[rows], r["ref"][rows])
        sums.append(L.reduce(per_token, r["mask"][rows], r["weights"][rows], loss))
        counts.append(L.count(r["mask"][rows], r["weights"][rows], loss, max_new_tokens=5))
    value = torch.stack(sums).sum() / torch.stack(counts).sum()
    value.backward()
    return value.item(), logps.grad


@pytest.mark.parametrize("loss", ["dapo", "grpo", "dr_grpo"])
def test_the_loss_and_gradient_do_not_depend_on_the_layout(loss):
    r = rollout()
    whole, grad = layout_loss(r, loss, 1)
    for chunks in (2, 4):  # 1 x 8 rows, 2 x 4, 4 x 2
        value, g = layout_loss(r, loss, chunks)
        assert value == pytest.approx(whole, rel=1e-6)
        torch.testing.assert_close(g, grad)


def test_bnpo_is_each_micro_batchs_token_mean_so_it_depends_on_the_layout():
    r = rollout()
    whole, _ = layout_loss(r, "bnpo", 1)
    dapo, _ = layout_loss(r, "dapo", 1)
    assert whole == pytest.approx(dapo)  # one micro-batch: its token mean is dapo's
    split, _ = layout_loss(r, "bnpo", 4)
    assert split != pytest.approx(whole, rel=1e-3)  # the micro-batches' token means, averaged: another number


def test_sampling_metrics_measure_the_samplers_distance_from_the_trainer_on_the_tokens_that_count():
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    sampler = torch.tensor([[-1.0, -2.2, -3.0], [-0.45, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the last token of row 2 is padding: its 9.0 is never seen
    m = L.sampling_metrics(logps, sampler, mask, torch.ones(2))
    total, count = m["sampling/logp_diff_mean"]
    assert count.item() == 5 and total.item() == pytest.approx(0.2 + 0.05)
    assert m["sampling/logp_diff_max"][0].item() == pytest.approx(0.2)
    # ratios exp(0.2) = 0.82 (outside [0.9, 1.1]) and exp(-0.05) = 0.95 (inside): one of five
    assert (m["sampling/ratio_outside"][0] / m["sampling/ratio_outside"][1]).item() == pytest.approx(0.2)
    zero = L.sampling_metrics(logps, sampler, mask, torch.tensor([0.0, 0.0]))  # padding rows count nothing
    assert zero["sampling/logp_diff_mean"][1].item() == 0


def test_the_truncated_importance_ratio_is_the_trainer_over_the_sampler_capped_and_detached():
    logps = torch.tensor([[-1.0, -1.0, -3.0]], requires_grad=True)
    sampler = torch.tensor([[-1.0, -1.5, 0.0]])
    w = L.truncated_ratio(logps, sampler, cap=3.0)
    assert not w.requires_grad
    assert w.tolist()[0] == pytest.approx([1.0, math.exp(0.5), math.exp(-3.0)])
    assert L.truncated_ratio(logps, sampler - 1, cap=2.0).tolist()[0] == pytest.approx([2.0, 2.0, math.exp(-2.0)])
