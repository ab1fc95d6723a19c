"""GRPO's completion span: the training forward, the old and the reference log-probs run the output layer on the
completions' positions alone (``logits_to_keep``), and every number they give is the one the whole sequence gives:
the per-token log-probs, the loss and its gradients, the entropy and clip metrics; plain logits and the chunked
output layer, fp32 and bf16 autocast."""

from __future__ import annotations

import copy
import dataclasses
from contextlib import nullcontext

import numpy as np
import pytest
import torch

from leantrain.modeling.chunked_loss import install_chunked_loss, keeps_logits
from leantrain.modeling.tasks import get_task
from leantrain.modeling.tasks import grpo_rollout as G
from leantrain.modeling.tasks.grpo_generation import Rollout
from leantrain.modeling.tasks.grpo_rewards import Reward
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
    width = max(len(c) for c in completions)
    padded = torch.tensor([c + [PAD] * (width - len(c)) for c in completions])
    rollout = Rollout(padded, (padded != PAD).long(), torch.tensor([False, True, False, True]))
    batch = {"prompt_input_ids": ids.masked_fill(mask == 0, PAD), "prompt_attention_mask": mask,
             "loss_weight": torch.tensor([1.0, 1.0]), "prompt": ["a", "b"], "columns": {}}
    s = G.Scored(batch, rollout, ["x"] * 4, completions, np.zeros((4, 1)), torch.zeros(4, dtype=torch.float64),
                 torch.ones(4, dtype=torch.bool))
    adv, std = torch.tensor([1.5, -0.5, 0.7, -0.7]), torch.ones(4)
    return G.training_rows(s, adv, std, torch.tensor(1.0), PAD, mask_truncated, num_generations=2)


def whole(batch: dict) -> dict:
    """The micro-batch without its span: every shifted target computed (as before the span)."""
    return {k: v for k, v in batch.items() if k != G.SPAN}


def test_the_span_is_the_width_less_the_shortest_prompt():
    batch = rows()
    assert batch["input_ids"].shape == (4, 9) and batch[G.SPAN] == 6  # 3 + 4 tokens less 3
    shifted = batch["labels"][:, 1:]
    assert (shifted[:, :-batch[G.SPAN]] == G.IGNORE).all()  # no completion token left out


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("mask_truncated", [False, True])
def test_the_span_gives_the_numbers_of_the_whole_sequence(chunked, bf16, mask_truncated):
    model = loss_llama(tied=False)
    if chunked:
        assert install_chunked_loss(model, chunk_tokens=5)
    task = dataclasses.replace(get_task("grpo"), loss="dapo", beta=0.3, num_iterations=2, reference="live",
                               rewards=(Reward("r", None),)).with_model(model)
    context = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else nullcontext
    batch = rows(mask_truncated)
    span = batch[G.SPAN]
    with context():
        full = task.token_logps(model, whole(batch)).detach()
        kept = task.token_logps(model, batch).detach()
        ref_full, ref_kept = task.reference_logps(model, whole(batch)), task.reference_logps(model, batch)
    assert kept.shape == (4, span) and full.shape == (4, 8)
    torch.testing.assert_close(kept, full[:, -span:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref_kept, ref_full[:, -span:], rtol=1e-5, atol=1e-5)

    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    results = []
    for b, old, ref in ((whole(batch), full, ref_full), (batch, kept, ref_kept)):
        b = {**b, "old_logps": old - 0.3, "ref_logps": ref + 0.05}  # the policy moved: some ratios clip
        model.zero_grad(set_to_none=True)
        with context():
            loss, metrics = task.step_loss(model, b)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), {k: torch.stack([v[0], v[1]]) for k, v in metrics.items()}, grads))
    hook.remove()
    assert seen == [9, span + 1]  # the output layer ran on the span's positions alone
    (loss_f, metrics_f, grads_f), (loss_k, metrics_k, grads_k) = results
    torch.testing.assert_close(loss_k, loss_f, rtol=1e-5, atol=1e-6)
    assert metrics_k.keys() == metrics_f.keys()
    assert ("entropy" in metrics_k) != chunked  # the chunked layer makes no logits to take it from
    for name in metrics_f:
        torch.testing.assert_close(metrics_k[name], metrics_f[name], rtol=1e-5, atol=1e-5, msg=name)
    assert float(metrics_k["clip_ratio"][0]) > 0
    for name in grads_f:
        err = float((grads_k[name] - grads_f[name]).abs().max() / grads_f[name].abs().max())
        # the chunked layer's bf16 weight gradient sums bf16 products of chunks that start elsewhere in the span
        assert err <= (1e-2 if chunked and bf16 and name == "lm_head.weight" else 1e-5), (name, err)


def test_the_entropy_is_each_completion_positions_from_its_logits():
    model = loss_llama(tied=False)
    task = dataclasses.replace(get_task("grpo"), rewards=(Reward("r", None),))
    batch = rows()
    _, metrics = task.step_loss(model, batch)
    with torch.no_grad():
        logp = model(input_ids=batch["input_ids"]).logits[:, :-1].float().log_softmax(-1)
    mask = (batch["labels"][:, 1:] != G.IGNORE).float()
    want = (-(logp.exp() * logp).sum(-1) * mask).sum()
    total, count = metrics["entropy"]
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-5)
    assert float(count) == float(mask.sum()) == 11


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
