"""The GRPO task's pieces: the resumable sampler, the training rows built from a rollout, the rollout metrics as exact
(sum, count) pairs, and the loss of a training micro-batch on a tiny Llama against its closed form at the sampling
policy."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from leantrain.config.grpo import GrpoConfig

from leantrain.methods import get_task
from leantrain.methods.grpo import forward as F
from leantrain.methods.grpo import rollout as G
from leantrain.methods.grpo.grpo import Sampler
from leantrain.modeling.generation.decode import Rollout
from leantrain.methods.grpo.rewards import Reward


def test_the_sampler_resumes_its_draws_bitwise():
    a = Sampler(seed=7, rank=1)
    torch.rand(3, generator=a.generator(torch.device("cpu")))
    saved = a.state_dict()
    want = torch.rand(5, generator=a.generator(torch.device("cpu")))
    b = Sampler(seed=0, rank=0)
    b.load_state_dict(saved)
    assert torch.equal(torch.rand(5, generator=b.generator(torch.device("cpu"))), want)
    assert not torch.equal(torch.rand(5, generator=Sampler(7, 0).generator(torch.device("cpu"))),
                           torch.rand(5, generator=Sampler(7, 1).generator(torch.device("cpu"))))  # per rank


def scored(mask_second: bool = False) -> G.Scored:
    """One left-padded prompt (ids 5 6) answered twice: [7 EOS] and [8 9 9] (truncated)."""
    batch = {"prompt_input_ids": torch.tensor([[0, 5, 6]]), "prompt_attention_mask": torch.tensor([[0, 1, 1]]),
             "loss_weight": torch.tensor([1.0]), "prompt": ["p"], "columns": {}}
    rollout = Rollout(torch.tensor([[7, 1, 0], [8, 9, 9]]), torch.tensor([[1, 1, 0], [1, 1, 1]]),
                      torch.tensor([False, True]))
    scores = np.array([[1.0, np.nan], [0.0, 0.5]])
    return G.Scored(batch, rollout, ["a", "bcc"], [[7, 1], [8, 9, 9]], scores,
                    torch.tensor([1.0, 0.5], dtype=torch.float64), torch.tensor([True, True]))


def test_a_training_batch_is_the_prompts_then_their_completions_labelled():
    s = scored()
    adv, std = torch.tensor([0.7, -0.7]), torch.tensor([0.35, 0.35])
    rows = G.training_rows(s, adv, std, torch.tensor(0.35), pad_id=0, mask_truncated=False, num_generations=2)
    assert rows[F.PROMPT_IDS].tolist() == [[0, 5, 6]] and rows[F.PROMPT_MASK].tolist() == [[0, 1, 1]]
    assert rows[F.COMPLETION_IDS].tolist() == [[7, 1, 0], [8, 9, 9]]
    assert rows[F.COMPLETION_MASK].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert rows[F.COMPLETION_LABELS].tolist() == [[7, 1, -100], [8, 9, 9]]
    masked = G.training_rows(s, adv, std, torch.tensor(0.35), pad_id=0, mask_truncated=True, num_generations=2)
    assert masked[F.COMPLETION_LABELS][1].tolist() == [-100] * 3  # truncated: its tokens weigh 0 (grpo.mask_truncated)
    assert rows["advantages"].tolist() == pytest.approx([0.7, -0.7])
    assert int(G.tokens(rows)) == 2 + 2 + 2 + 3


def test_rollout_metrics_are_sums_and_counts_over_the_rows_that_count():
    s = scored()
    values = G.rollout_values(s, torch.tensor([0.35, 0.0], dtype=torch.float64), torch.tensor(0.35))
    rewards = [Reward("right", None), Reward("short", None)]
    names = G.metric_names(rewards)
    assert names[-2:] == ("rewards/right/mean", "rewards/short/mean")
    got = {k: (float(t), float(c)) for k, (t, c) in G.rollout_metrics(values, torch.tensor([1.0, 1.0]),
                                                                      names).items()}
    assert got["reward"] == pytest.approx((1.5, 2.0))
    assert got["frac_reward_zero_std"] == (1.0, 2.0)
    assert got["completions/mean_length"] == (5.0, 2.0) and got["completions/clipped_ratio"] == (1.0, 2.0)
    assert got["rewards/short/mean"] == (0.5, 1.0)  # None (NaN) left out, as TRL's nanmean
    padded = G.rollout_metrics(values, torch.tensor([1.0, 0.0]), names)  # the second row is padding
    assert float(padded["reward"][1]) == 1.0
    assert G.samples(s, rewards, 1) == [{"prompt": "p", "completion": "a", "reward": 1.0,
                                         "rewards": {"right": 1.0, "short": None}}]


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1)).eval()


def micro_batch(g) -> dict:
    """One prompt of 3 tokens answered twice: 3 and 1 completion tokens, advantages 1.5 and -0.5."""
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    ids = torch.randint(2, 32, (2, 3), generator=g)
    return {F.PROMPT_IDS: torch.randint(2, 32, (1, 3), generator=g), F.PROMPT_MASK: torch.ones(1, 3, dtype=torch.long),
            F.COMPLETION_IDS: ids.masked_fill(mask == 0, 0), F.COMPLETION_MASK: mask,
            F.COMPLETION_LABELS: ids.masked_fill(mask == 0, -100), "advantages": torch.tensor([1.5, -0.5]),
            "loss_weight": torch.tensor([1.0, 1.0]), "rollout_values": torch.zeros(2, 6)}


@pytest.mark.parametrize("loss, want", [
    ("dapo", -(1.5 * 3 - 0.5 * 1)),  # at the sampling policy each token's loss is -A: summed over the tokens
    ("grpo", -(1.5 - 0.5)),  # each sequence's token mean
    ("bnpo", -(1.5 * 3 - 0.5 * 1) / 4),  # the micro-batch's token mean
])
def test_the_loss_at_the_sampling_policy_is_minus_the_advantage_per_token(llama, loss, want):
    task = dataclasses.replace(get_task("grpo"), grpo=GrpoConfig(loss=loss), rewards=(Reward("r", None),))
    batch = micro_batch(torch.Generator().manual_seed(0))
    loss_sum, metrics = task.step.loss(llama, batch)
    assert loss_sum.item() == pytest.approx(want, rel=1e-6)
    assert [float(x) for x in metrics["clip_ratio"]] == [0.0, 4.0]  # nothing clipped, 4 completion tokens
    assert 0 < float(metrics["entropy"][0]) / 4 <= math.log(32) + 1e-5
    assert "kl" not in metrics


def test_the_kl_penalty_and_the_ratio_read_the_reference_and_old_log_probs(llama):
    task = dataclasses.replace(get_task("grpo"), grpo=GrpoConfig(loss="dapo", beta=0.5), rewards=(Reward("r", None),))
    batch = micro_batch(torch.Generator().manual_seed(1))
    logps = task.token_logps(llama, batch).detach()
    batch.update(ref_logps=logps, old_logps=logps - 0.5)  # the policy moved: ratio e^0.5 > 1.2 everywhere
    loss_sum, metrics = task.step.loss(llama, batch)
    assert [float(x) for x in metrics["kl"]] == pytest.approx([0.0, 4.0], abs=1e-6)  # at the reference
    # row 0 (A = 1.5 > 0): clipped at 1.2; row 1 (A = -0.5): min(-0.5 e^0.5, -0.6) = -0.5 e^0.5, not clipped
    assert loss_sum.item() == pytest.approx(-1.2 * 1.5 * 3 + 0.5 * math.exp(0.5), rel=1e-5)
    assert [float(x) for x in metrics["clip_ratio"]] == [3.0, 4.0]


@pytest.mark.parametrize("mode, generation, corrected", [
    ("auto", "transformers", False), ("auto", "vllm", True), ("on", "transformers", True), ("off", "vllm", False)])
def test_the_importance_sampling_correction_weighs_each_tokens_loss_by_the_capped_ratio(llama, mode, generation,
                                                                                          corrected):
    """The sampler gave each token half the trainer's probability (ratio 2), one token a tenth (ratio 10, capped at
    3): corrected, each token's loss -A is weighed by its ratio; the metrics measure the gap either way."""
    g = GrpoConfig(loss="dapo", importance_sampling=mode, generation=generation)
    task = dataclasses.replace(get_task("grpo"), grpo=g, rewards=(Reward("r", None),))
    batch = micro_batch(torch.Generator().manual_seed(0))
    logps = task.token_logps(llama, batch).detach()
    sampler = logps - math.log(2.0)
    sampler[0, 2] = logps[0, 2] - math.log(10.0)
    batch["sampler_logps"] = sampler
    loss_sum, metrics = task.step.loss(llama, batch)
    want = -(1.5 * (2 + 2 + 3) - 0.5 * 2) if corrected else -(1.5 * 3 - 0.5 * 1)
    assert loss_sum.item() == pytest.approx(want, rel=1e-5)
    assert float(metrics["sampling/logp_diff_max"][0]) == pytest.approx(math.log(10.0), rel=1e-5)
    assert [float(x) for x in metrics["sampling/ratio_outside"]] == [4.0, 4.0]


class _Tok:
    """What the GRPO task's evaluation reads of a tokenizer: the ids, decoded as numbers."""

    eos_token_id, pad_token_id = 1, 0

    def batch_decode(self, ids, skip_special_tokens=True):  # noqa: ANN001, ANN201
        return [" ".join(map(str, x)) for x in ids]


def test_evaluation_is_one_greedy_completion_per_prompt_whatever_num_generations_and_the_eval_batch(llama):
    """An eval batch of 3 prompts with grpo.num_generations=4 (not dividing it) is evaluated: one greedy completion
    per prompt, the same as each prompt alone and as under another num_generations, so the eval batch needs no
    multiple of it (no config check)."""

    def length(completions, **kwargs):  # noqa: ANN001, ANN202
        return [float(len(c.split())) for c in completions]

    def task(g):  # noqa: ANN001, ANN202
        return dataclasses.replace(get_task("grpo"), grpo=GrpoConfig(num_generations=g, max_new_tokens=5),
                                   rewards=(Reward("length", length),), processor=_Tok())

    ids = torch.randint(2, 32, (3, 4), generator=torch.Generator().manual_seed(2))

    def batch(rows):  # noqa: ANN001, ANN202
        return {"prompt_input_ids": ids[rows], "prompt_attention_mask": torch.ones_like(ids[rows]),
                "loss_weight": torch.ones(len(rows)), "prompt": [f"p{i}" for i in rows], "columns": {}}

    (three,) = task(4).evaluation.outputs(llama, batch([0, 1, 2]))
    assert three.shape == (3, 2) and not three.isnan().any()
    assert torch.equal(three, task(3).evaluation.outputs(llama, batch([0, 1, 2]))[0])
    alone = torch.cat([task(4).evaluation.outputs(llama, batch([i]))[0] for i in range(3)])
    assert torch.equal(three, alone)


def test_only_another_engine_has_weights_to_push_before_it_generates():
    """vLLM samples from its own copy of the weights (pushed, and timed as ``weight_sync``); leantrain's engine from
    the model itself: nothing to push."""
    from leantrain.modeling.generation import vllm_engine

    own = dataclasses.replace(get_task("grpo"), grpo=GrpoConfig(generation="auto"))
    assert own.sync_weights is None
    other = dataclasses.replace(get_task("grpo"), grpo=GrpoConfig(generation="vllm", vllm_memory=0.2))
    assert other.sync_weights.func is vllm_engine.sync and other.sync_weights.keywords["settings"].memory == 0.2
