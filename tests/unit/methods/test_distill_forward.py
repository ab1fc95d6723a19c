"""Distillation's forward (``methods/distill/forward.py``, ``Distill.divergence``): the loss of a micro-batch through
the chunked output layers (the student's states and weight, the teacher's kept states) equals the loss from both
models' plain logits, in value and in the student's gradients, while the largest tensor it makes is a chunk's, not
the batch's ``tokens x vocabulary``; the positions are the ones that predict each completion token."""

from __future__ import annotations

import copy
import dataclasses

import torch

from leantrain.config.distill import DistillConfig
from leantrain.methods import get_task
from leantrain.methods.distill import forward as D
from leantrain.modeling.chunked_loss import install_chunked_loss
from tests.helpers import LargestTensor
from tests.tiny_models import loss_llama

VOCAB = 4096  # a vocabulary much wider than a chunk of the divergence (a quarter of 2**24 / 4096 = 1024 rows)


def batch(rows: int = 3, prompt: int = 5, completion: int = 1000, seed: int = 2) -> dict:
    """Left-padded prompts and right-padded completions (one row shorter), weights with a padding row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (rows, prompt), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    answers = torch.randint(3, VOCAB, (rows, completion), generator=g)
    done = torch.ones_like(answers)
    done[1, completion // 2:] = 0
    loaded = {"prompt_input_ids": ids, "prompt_attention_mask": mask, "completion_ids": answers,
              "completion_mask": done, "loss_weight": torch.tensor([1.0, 1.0, 0.0])[:rows]}
    return D.training_rows(loaded, None, completion, 0, on_policy=False)


def method(teacher, beta: float = 0.5, top_k: int = 0, captured: bool = True):
    """Distillation bound to ``teacher``: its output layer captured as a run binds it, or (``captured`` false) left
    plain: its logits kept."""
    task = dataclasses.replace(get_task("distill"), distill=DistillConfig(teacher="t", beta=beta, teacher_top_k=top_k,
                                                                          max_new_tokens=1000, temperature=0.9))
    if captured:
        return task.evaluation.with_reference(teacher)
    return dataclasses.replace(task, teacher=teacher.eval().requires_grad_(False))


def loss_and_grads(task, student, rows):
    rows = dict(rows)
    task.add_teacher(rows)
    student.zero_grad(set_to_none=True)
    loss, metrics = task.step.loss(student, rows)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}, metrics


def test_the_chunked_loss_is_the_plain_one_without_the_batchs_logits():
    student, teacher = loss_llama(tied=False, vocab=VOCAB, seed=0), loss_llama(tied=True, vocab=VOCAB, seed=1)
    rows = batch()
    plain_teacher = method(copy.deepcopy(teacher), captured=False)
    assert D.TEACHER_LOGITS in (lambda r: (plain_teacher.add_teacher(r), r)[1])(dict(rows))
    plain = loss_and_grads(plain_teacher, copy.deepcopy(student), rows)  # both models' logits
    install_chunked_loss(student)
    task = method(teacher)  # with_reference captures the teacher's output layer
    assert D.TEACHER_STATES in (lambda r: (task.add_teacher(r), r)[1])(dict(rows))
    with LargestTensor() as seen:
        chunked = loss_and_grads(task, student, rows)
    torch.testing.assert_close(chunked[0], plain[0], rtol=1e-5, atol=1e-6)
    for name, grad in plain[1].items():
        torch.testing.assert_close(chunked[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    tokens = rows["completion_ids"].numel()
    # a chunk's fp32 logits (1,024 rows x 4,096), not the batch's (3,000 x 4,096): a third of them
    assert seen.bytes <= 1024 * VOCAB * 4 < tokens * VOCAB * 4 / 2
    # the metrics count the completion tokens of the rows that weigh (row 2 is padding, row 1 is half as long)
    assert chunked[2]["kl"][1].item() == 1000 + 500


def test_the_loss_weighs_the_positions_that_predict_each_completion_token():
    """The divergence of a row is the same whatever the other rows and the padding beside it."""
    student, teacher = loss_llama(tied=True, vocab=VOCAB, seed=0), loss_llama(tied=True, vocab=VOCAB, seed=1)
    task = method(teacher, beta=1.0)
    rows = batch(completion=12)
    with torch.no_grad():
        both = dict(rows)
        task.add_teacher(both)
        whole = task.divergence(student, both)[0].view(3, -1)
        alone = {k: v[:1] if torch.is_tensor(v) else v for k, v in rows.items()}
        task.add_teacher(alone)
        first = task.divergence(student, alone)[0].view(1, -1)
    torch.testing.assert_close(whole[0], first[0], rtol=1e-5, atol=1e-6)


def test_top_k_runs_through_the_step():
    student, teacher = loss_llama(tied=True, vocab=VOCAB, seed=0), loss_llama(tied=True, vocab=VOCAB, seed=1)
    loss, grads, metrics = loss_and_grads(method(teacher, beta=1.0, top_k=8), student, batch(completion=6))
    assert torch.isfinite(loss) and loss > 0 and all(torch.isfinite(g).all() for g in grads.values())
