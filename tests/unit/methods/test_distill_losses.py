"""Distillation's loss (``methods/distill/losses.py``): the generalised JSD against TRL's formula written out with
``F.kl_div``, its two ends against the forward and reverse KL by hand, the top-k buckets, and the chunked,
checkpointed computation from output-layer states against the plain one on whole logits: the same values and the same
gradients of the states and the output layer's weight."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from leantrain.methods.distill import losses as L


def trl_generalized_jsd(student_logits, teacher_logits, beta, temperature=1.0):
    """TRL's ``GKDTrainer.generalized_jsd_loss`` per token (reduction none, summed over the vocabulary)."""
    s = F.log_softmax(student_logits / temperature, dim=-1)
    t = F.log_softmax(teacher_logits / temperature, dim=-1)
    if beta == 0:
        jsd = F.kl_div(s, t, reduction="none", log_target=True)
    elif beta == 1:
        jsd = F.kl_div(t, s, reduction="none", log_target=True)
    else:
        b = torch.tensor(beta, dtype=s.dtype)
        mixture = torch.logsumexp(torch.stack([s + torch.log(1 - b), t + torch.log(b)]), dim=0)
        jsd = b * F.kl_div(mixture, t, reduction="none", log_target=True) + \
            (1 - b) * F.kl_div(mixture, s, reduction="none", log_target=True)
    return jsd.sum(-1)


def logits(n=7, v=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, v, generator=g, dtype=torch.float64) * 2 for _ in range(2))


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_generalised_jsd_is_trls(beta, temperature):
    s, t = logits()
    targets = torch.arange(7) % 11
    div, s_lp, t_lp = L.divergence(s, t, targets, beta, temperature)
    torch.testing.assert_close(div, trl_generalized_jsd(s, t, beta, temperature))
    # the log-probs of the targets are at temperature 1 whatever the loss's
    torch.testing.assert_close(s_lp, s.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1))
    torch.testing.assert_close(t_lp, t.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1))


def test_beta_0_is_the_forward_kl_and_1_the_reverse_by_hand():
    p = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64)  # the student
    q = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64)  # the teacher
    forward = sum(b * math.log(b / a) for a, b in zip(p[0].tolist(), q[0].tolist()))  # KL(teacher || student)
    reverse = sum(a * math.log(a / b) for a, b in zip(p[0].tolist(), q[0].tolist()))  # KL(student || teacher)
    assert L.generalized_jsd(p.log(), q.log(), 0.0).item() == pytest.approx(forward)
    assert L.generalized_jsd(p.log(), q.log(), 1.0).item() == pytest.approx(reverse)
    m = 0.5 * p + 0.5 * q
    jsd = 0.5 * (q * (q / m).log()).sum() + 0.5 * (p * (p / m).log()).sum()
    assert L.generalized_jsd(p.log(), q.log(), 0.5).item() == pytest.approx(jsd.item())
    assert L.generalized_jsd(q.log(), q.log(), 0.3).item() == pytest.approx(0.0, abs=1e-12)


def test_top_k_keeps_the_teachers_k_tokens_and_the_tail_mass():
    p = torch.tensor([[0.1, 0.6, 0.2, 0.1]], dtype=torch.float64)
    q = torch.tensor([[0.05, 0.5, 0.4, 0.05]], dtype=torch.float64)
    s, t = L.top_k_buckets(p.log(), q.log(), 2)  # the teacher's top 2: ids 1 and 2
    torch.testing.assert_close(s.exp(), torch.tensor([[0.6, 0.2, 0.2]], dtype=torch.float64))
    torch.testing.assert_close(t.exp(), torch.tensor([[0.5, 0.4, 0.1]], dtype=torch.float64))
    # k = the vocabulary: the buckets are the distributions (the tail holds the floor alone)
    div = L.divergence(p.log() * 3, q.log() * 3, torch.tensor([1]), 1.0, 1.0, top_k=4)[0]
    full = L.divergence(p.log() * 3, q.log() * 3, torch.tensor([1]), 1.0, 1.0)[0]
    assert div.item() == pytest.approx(full.item(), abs=1e-5)


@pytest.mark.parametrize("beta,top_k", [(1.0, 0), (0.0, 0), (0.5, 0), (1.0, 3)])
def test_the_chunked_checkpointed_divergence_is_the_plain_one_with_its_gradients(beta, top_k):
    torch.manual_seed(0)
    n, h, v = 10, 6, 13
    states = torch.randn(n, h, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.float64, requires_grad=True)
    teacher_states, teacher_weight = torch.randn(n, h, dtype=torch.float64), torch.randn(v, h, dtype=torch.float64)
    targets = torch.randint(0, v, (n,))
    scale = torch.linspace(0.5, 2, n, dtype=torch.float64)  # a different incoming gradient per token

    plain = L.divergence(states @ weight.T, teacher_states @ teacher_weight.T, targets, beta, 0.8, top_k)
    (plain[0] * scale).sum().backward()
    want = [plain[0].detach(), states.grad.clone(), weight.grad.clone()]
    states.grad = weight.grad = None

    student = L.Logits(states=states, weight=weight, dtype=torch.float64)
    teacher = L.Logits(states=teacher_states, weight=teacher_weight, dtype=torch.float64)
    chunked = L.chunked_divergence(student, teacher, targets, beta, 0.8, top_k, chunk=3)  # 4 chunks, the last of 1
    (chunked[0] * scale).sum().backward()
    for a, b in zip([chunked[0].detach(), states.grad, weight.grad], want):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(chunked[1], plain[1])
    torch.testing.assert_close(chunked[2], plain[2])


def test_a_teacher_with_a_wider_padded_vocabulary_is_compared_on_the_common_ids():
    torch.manual_seed(1)
    states, weight = torch.randn(4, 5, dtype=torch.float64), torch.randn(9, 5, dtype=torch.float64)
    wide = torch.cat([weight, torch.randn(3, 5, dtype=torch.float64)])  # 3 more rows: ids no tokenizer makes
    targets = torch.tensor([0, 3, 8, 2])
    same = L.chunked_divergence(L.Logits(states=states, weight=weight, dtype=torch.float64),
                                L.Logits(states=states, weight=wide, dtype=torch.float64), targets, 1.0, 1.0, 0, 2)
    torch.testing.assert_close(same[0], torch.zeros(4, dtype=torch.float64))
    # plain logits on either side read the same columns
    plain = L.chunked_divergence(L.Logits(logits=states @ weight.T),
                                 L.Logits(logits=states @ wide.T), targets, 1.0, 1.0, 0, 2)
    torch.testing.assert_close(plain[0], torch.zeros(4, dtype=torch.float64))


def test_no_tokens_give_empty_values():
    empty = L.Logits(states=torch.zeros(0, 5), weight=torch.randn(9, 5))
    div, s, t = L.chunked_divergence(empty, empty, torch.zeros(0, dtype=torch.long), 0.5, 1.0, 0, 4)
    assert div.shape == s.shape == t.shape == (0,)
