"""GRPO's training forward (``grpo_forward``): the prompts encoded once for their G completions (the KV cache carried
through the backward) give the numbers of the concatenated rows, which give those of the whole sequences' logits:
the per-token log-probs, the loss and its gradients, the entropy and clip metrics; fp32 and bf16 autocast, with and
without ``grpo.mask_truncated``; and the concatenated rows are taken where the cache cannot be carried."""

from __future__ import annotations

import copy
import dataclasses
from contextlib import nullcontext

import numpy as np
import pytest
import torch

from leantrain.modeling.chunked_loss import install_chunked_loss, keeps_logits
from leantrain.modeling.switches import enable_checkpointing
from leantrain.config.grpo import GrpoConfig
from leantrain.methods import get_task
from leantrain.methods.grpo import forward as F
from leantrain.methods.grpo import rollout as G
from leantrain.modeling.generation.decode import Rollout
from leantrain.methods.grpo.rewards import Reward
from tests.tiny_models import LOSS_VOCAB, loss_llama

PAD = 0


def rows(mask_truncated: bool = False) -> dict:
    """A training micro-batch of 2 prompts (3 and 5 tokens, left-padded) x 2 completions (2, 4, 1 and 4 tokens, the
    last truncated), built as a rollout's (``training_rows``)."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, LOSS_VOCAB, (2, 5), generator=g)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    completions = [torch.randint(3, LOSS_VOCAB, (n,), generator=g).tolist() for n in (2, 4, 1, 4)]
    completions[0][-1] = completions[2][-1] = 2  # EOS
    padded = torch.tensor([c + [PAD] * (6 - len(c)) for c in completions])  # as decoded: 6 steps
    rollout = Rollout(padded, (padded != PAD).long(), torch.tensor([False, True, False, True]))
    batch = {"prompt_input_ids": ids.masked_fill(mask == 0, PAD), "prompt_attention_mask": mask,
             "loss_weight": torch.tensor([1.0, 1.0]), "prompt": ["a", "b"], "columns": {}}
    s = G.Scored(batch, rollout, ["x"] * 4, completions, np.zeros((4, 1)), torch.zeros(4, dtype=torch.float64),
                 torch.ones(4, dtype=torch.bool))
    adv, std = torch.tensor([1.5, -0.5, 0.7, -0.7]), torch.ones(4)
    return G.training_rows(s, adv, std, torch.tensor(1.0), PAD, mask_truncated, num_generations=2)


def test_the_batch_holds_each_prompt_once_and_its_completions_cut_at_the_longest():
    batch = rows(mask_truncated=True)
    assert batch[F.PROMPT_IDS].shape == (2, 5) and batch[F.COMPLETION_IDS].shape == (4, 4)
    assert batch[F.COMPLETION_MASK].sum(-1).tolist() == [2, 4, 1, 4]
    assert (batch[F.COMPLETION_LABELS] != G.IGNORE).sum(-1).tolist() == [2, 0, 1, 0]  # truncated: masked
    assert int(G.tokens(batch)) == 3 * 2 + 5 * 2 + 2 + 4 + 1 + 4  # each row's prompt without padding + completion
    whole = F.concatenated(batch)
    assert whole["input_ids"].shape == (4, 9) and whole["position_ids"][0].tolist() == [0, 0, 0, 1, 2, 3, 4, 4, 4]


def grpo(model):
    return dataclasses.replace(get_task("grpo"), grpo=GrpoConfig(loss="dapo", beta=0.3, num_iterations=2), reference="live",
                               rewards=(Reward("r", None),)).model.bind(model)


def step(task, model, batch, context) -> tuple:
    """(loss, metrics as stacked (sum, count), gradients) of one training micro-batch."""
    model.zero_grad(set_to_none=True)
    with context():
        loss, metrics = task.step.loss(model, batch)
    loss.backward()
    return (loss.detach(), {k: torch.stack([v[0], v[1]]) for k, v in metrics.items()},
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})


def assert_same_step(got: tuple, want: tuple, grad_tol: float = 1e-5) -> None:
    (loss_g, metrics_g, grads_g), (loss_w, metrics_w, grads_w) = got, want
    torch.testing.assert_close(loss_g, loss_w, rtol=1e-5, atol=1e-5)
    assert metrics_g.keys() == metrics_w.keys()
    for name in metrics_w:
        torch.testing.assert_close(metrics_g[name], metrics_w[name], rtol=1e-4, atol=1e-4, msg=name)
    assert grads_g.keys() == grads_w.keys()
    for name in grads_w:
        err = float((grads_g[name] - grads_w[name]).abs().max() / grads_w[name].abs().max())
        assert err <= grad_tol, (name, err)


@pytest.mark.parametrize("bf16, mask_truncated, chunked", [(False, False, False), (False, True, False),
                                                            (True, False, False), (True, True, False),
                                                            (False, False, True), (True, True, True)])
def test_shared_prompts_give_the_numbers_of_the_concatenated_rows(bf16, mask_truncated, chunked, monkeypatch):
    model = loss_llama(tied=False)
    if chunked:
        assert install_chunked_loss(model, chunk_tokens=5)
    task = grpo(model)
    context = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else nullcontext
    batch = rows(mask_truncated)
    assert F.shares_prompts(model)
    seen, heads = [], []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    head_hook = model.lm_head.register_forward_hook(lambda m, i, o: heads.append(i[0].shape[:2]))
    with context():
        shared = task.token_logps(model, batch).detach()
        ref_shared = task.reference_logps(model, batch)
    # each prompt but its last token once, then the prompt's last token and its completion (but the completion's last
    # token, which predicts nothing: under the chunked loss it is forwarded too, as it always was, for bitwise-equal
    # runs); the output layer on no prompt position
    assert seen[:2] == [(2, 4), (4, 5 if chunked else 4)] and heads[0] == (2, 0)
    batch = {**batch, "old_logps": shared - 0.3, "ref_logps": ref_shared + 0.05}  # the policy moved: some ratios clip
    got = step(task, model, batch, context)
    hook.remove(), head_hook.remove()
    monkeypatch.setattr(F, "shares_prompts", lambda model: False)
    with context():
        concatenated = task.token_logps(model, batch).detach()
    assert shared.shape == concatenated.shape == (4, 4)
    tol = 2e-2 if bf16 else 1e-5  # bf16: other matmul shapes round otherwise
    torch.testing.assert_close(shared, concatenated, rtol=tol, atol=tol)
    want = step(task, model, batch, context)
    assert float(got[1]["clip_ratio"][0]) > 0 and "kl" in got[1]
    assert "entropy" in got[1]  # the chunked loss takes it chunk by chunk (compared above: assert_same_step)
    if bf16:
        torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-2)
    else:
        assert_same_step(got, want, grad_tol=1e-5)


@pytest.mark.parametrize("chunked", [False, True])
def test_the_concatenated_rows_give_the_whole_sequences_numbers(chunked):
    """The output layer on the completion positions alone (``logits_to_keep``) against every position's."""
    model = loss_llama(tied=False)
    if chunked:
        assert install_chunked_loss(model, chunk_tokens=5)
    task = grpo(model)
    whole = F.concatenated(rows())
    seen = []
    hook = model.lm_head.register_forward_pre_hook(lambda m, i: seen.append(i[0].shape[1]), prepend=True)  # as
    # transformers calls it, before the chunked loss's own pre-hook takes its input
    kept = task.token_losses(model, whole, keep=4)
    full = task.token_losses(model, whole)
    hook.remove()
    assert seen == [5, 9] and kept.shape == (4, 4)
    torch.testing.assert_close(kept, full[:, -4:], rtol=1e-5, atol=1e-5)


def test_the_entropy_is_each_completion_positions_from_its_logits():
    model = loss_llama(tied=False)
    task = dataclasses.replace(get_task("grpo"), rewards=(Reward("r", None),))
    batch = rows()
    _, metrics = task.step.loss(model, batch)
    whole = F.concatenated(batch)
    with torch.no_grad():
        logits = model(input_ids=whole["input_ids"], attention_mask=whole["attention_mask"],
                       position_ids=whole["position_ids"]).logits
        logp = logits[:, -5:-1].float().log_softmax(-1)
    mask = batch[F.COMPLETION_MASK].float()
    want = (-(logp.exp() * logp).sum(-1) * mask).sum()
    total, count = metrics["entropy"]
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-5)
    assert float(count) == float(mask.sum()) == 11


def test_the_cache_is_not_carried_where_the_forward_would_drop_or_replay_it():
    model = loss_llama()
    assert F.shares_prompts(model)
    checkpointed = copy.deepcopy(model)
    enable_checkpointing(checkpointed)
    assert not F.shares_prompts(checkpointed)  # transformers drops the cache under checkpointing
    assert not F.shares_prompts(torch.compile(model))  # a wrapper other than DDP
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert F.shares_prompts(lora)


def test_keeps_logits_sees_through_peft_and_instance_forwards():
    peft = pytest.importorskip("peft")
    model = loss_llama()
    assert keeps_logits(model)
    lora = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert keeps_logits(lora)
    forward = model.forward
    model.forward = lambda *args, **kwargs: forward(*args, **kwargs)  # as FSDP's autocast wraps it
    assert keeps_logits(model)
    assert not keeps_logits(torch.nn.Linear(2, 2))


def test_the_memory_models_batch_is_m_prompts_and_their_completions():
    """``leantrain plan`` calibrates on m synthetic rows: each cut at the prompt budget, its next ``max_new_tokens``
    tokens as each of the G completions; the loss runs on it as on a rollout's batch."""
    model = loss_llama()
    first = grpo(model)
    task = dataclasses.replace(first, grpo=first.grpo.model_copy(update={"num_generations": 2, "max_new_tokens": 3,
                                                                   "beta": 0.0}), prompt_tokens=6)
    ids = torch.randint(3, LOSS_VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    batch = task.model.calibration_batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids,
                                          "loss_weight": torch.ones(2)})
    assert batch[F.PROMPT_IDS].tolist() == ids[:, :6].tolist()
    assert batch[F.COMPLETION_IDS].tolist() == ids[:, 6:9].repeat_interleave(2, 0).tolist()
    assert batch["old_logps"].shape == (4, 3) and "ref_logps" not in batch  # num_iterations 2, beta 0
    loss, _ = task.step.forward_loss(model, batch)
    assert torch.isfinite(loss) and loss.requires_grad
