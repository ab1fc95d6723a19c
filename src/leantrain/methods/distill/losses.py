"""Distillation's loss as tensor functions: the generalised Jensen-Shannon divergence per token between a student's
and a teacher's next-token distributions (TRL's ``GKDTrainer.generalized_jsd_loss``: ``beta`` 0 is the forward
KL(teacher || student), 1 the reverse KL(student || teacher)), on the whole vocabulary or on the teacher's top k
tokens plus one bucket for the rest of each model's mass, computed a chunk of tokens at a time.

The two models' outputs come as :class:`Logits`: an output layer's input states and its weight (the chunked output
layer's capture: ``chunked_loss.final_hidden``; the logits of a chunk are made from them in the forward's matmul
dtype), or plain logits. :func:`chunked_divergence` makes each chunk's fp32 logits of both models, their divergence
and each model's log-prob of the target token, inside ``torch.utils.checkpoint``: the chunk's ``tokens x vocab``
tensors are freed after its forward and made again in its backward, so the largest temporaries are one chunk's, never
``tokens x vocab`` for the batch, and never of both models at once beyond a chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

TAIL_FLOOR = 1e-6  # the tail bucket's mass is at least this (its log stays finite when the top k hold it all)


@dataclass(frozen=True)
class Logits:
    """Rows of next-token logits, made a chunk at a time: from ``states [n, H]`` and an output layer's ``weight [V, H]``
    (and ``bias``) in ``dtype``, or given as ``logits [n, V]``; the first ``vocab`` columns (the two models' common
    vocabulary)."""

    states: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    dtype: torch.dtype = torch.float32
    logits: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return (self.states if self.logits is None else self.logits).shape[0]

    @property
    def width(self) -> int:
        return (self.weight if self.logits is None else self.logits.T).shape[0]


def chunk_logits(source: Logits, states: torch.Tensor, vocab: int) -> torch.Tensor:
    """The fp32 (or fp64) logits of a chunk: ``states`` its rows of ``source.states`` (or of ``source.logits``)."""
    if source.logits is not None:
        return at_least_fp32(states[:, :vocab])
    bias = None if source.bias is None else source.bias[:vocab].to(source.dtype)
    return at_least_fp32(F.linear(states.to(source.dtype), source.weight[:vocab].to(source.dtype), bias))


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def generalized_jsd(student: torch.Tensor, teacher: torch.Tensor, beta: float) -> torch.Tensor:
    """Per row, the generalised JSD of two log-probability rows ``[n, V]`` (fp32): ``beta`` KL(teacher || m) +
    (1 - ``beta``) KL(student || m), ``m = beta teacher + (1 - beta) student`` (TRL's); 0: KL(teacher || student), 1:
    KL(student || teacher)."""
    if beta == 0:
        return (teacher.exp() * (teacher - student)).sum(-1)
    if beta == 1:
        return (student.exp() * (student - teacher)).sum(-1)
    mixture = torch.logaddexp(student + math.log(1 - beta), teacher + math.log(beta))
    return (beta * (teacher.exp() * (teacher - mixture)).sum(-1)
            + (1 - beta) * (student.exp() * (student - mixture)).sum(-1))


def top_k_buckets(student: torch.Tensor, teacher: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Both log-probability rows ``[n, V]`` reduced to ``[n, k + 1]``: the teacher's k most likely tokens, then a tail
    bucket with the rest of each model's mass (at least ``TAIL_FLOOR``)."""
    ids = teacher.topk(min(k, teacher.shape[-1]), dim=-1).indices

    def buckets(logp: torch.Tensor) -> torch.Tensor:
        top = logp.gather(-1, ids)
        rest = (1 - top.exp().sum(-1, keepdim=True)).clamp(min=TAIL_FLOOR)
        return torch.cat([top, rest.log()], dim=-1)

    return buckets(student), buckets(teacher)


def divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor, beta: float,
               temperature: float, top_k: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-row divergence, the student's and the teacher's log-prob of ``targets`` at temperature 1, both without
    gradient) of fp32 logit rows ``[n, V]``: both scaled by ``1 / temperature``, the generalised JSD on the whole
    vocabulary or (``top_k``) on the teacher's top k plus the tail."""
    s = (student_logits / temperature).log_softmax(-1)
    t = (teacher_logits / temperature).log_softmax(-1)
    div = generalized_jsd(*top_k_buckets(s, t, top_k), beta) if top_k else generalized_jsd(s, t, beta)
    with torch.no_grad():
        picked = targets.unsqueeze(-1)
        if temperature == 1:
            own = [x.gather(-1, picked).squeeze(-1) for x in (s, t)]
        else:
            own = [x.gather(-1, picked).squeeze(-1) - x.logsumexp(-1) for x in (student_logits, teacher_logits)]
    return div, own[0], own[1]


def chunked_divergence(student: Logits, teacher: Logits, targets: torch.Tensor, beta: float, temperature: float,
                       top_k: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`divergence` of ``n`` rows, ``chunk`` rows at a time, each chunk checkpointed (module doc); the two
    models' first ``min`` vocabulary columns (a vocabulary padded wider in one model: the ids past the narrower one are
    never produced by the shared tokenizer)."""
    vocab = min(student.width, teacher.width)
    s_rows = student.states if student.logits is None else student.logits
    t_rows = teacher.states if teacher.logits is None else teacher.logits

    def one(s: torch.Tensor, t: torch.Tensor, y: torch.Tensor):  # noqa: ANN202
        return divergence(chunk_logits(student, s, vocab), chunk_logits(teacher, t, vocab), y, beta, temperature,
                          top_k)

    parts = []
    for start in range(0, max(1, student.rows), max(1, int(chunk))):
        cut = slice(start, start + chunk)
        args = (s_rows[cut], t_rows[cut].detach(), targets[cut])
        parts.append(checkpoint(one, *args, use_reentrant=False) if torch.is_grad_enabled() else one(*args))
    return tuple(torch.cat(p) for p in zip(*parts))
