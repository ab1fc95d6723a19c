"""The preference losses as pure functions of sequence log-probs, one value per pair (or per feedback row), fp32, and
the log-prob helpers the preference tasks share. TRL's definitions (``DPOTrainer``, ``CPOTrainer``, ``ORPOTrainer``,
``KTOTrainer``, ``RewardTrainer``), so that its users read the same numbers; where this differs it is said.

A sequence's log-prob is the sum of its completion tokens' log-probs (labels != -100), i.e. minus the sum of the
per-token cross-entropies ``CausalLM.token_losses`` returns; its length is the number of those tokens.

Rewards (what ``eval.chosen_reward`` / ``eval.rejected_reward`` report): with a reference, beta x (policy log-prob
- reference log-prob); reference-free (simpo, orpo), beta x the length-normalised policy log-prob.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE = -100


def sequence_logps(token_losses: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob, completion length) per row, fp32, from the ``(rows, T-1)`` per-token losses of the shifted
    targets (0 where the label is -100) and the unshifted ``labels (rows, T)``."""
    lengths = (labels[:, 1:] != IGNORE).sum(-1).to(torch.float32)
    return -token_losses.float().sum(-1), lengths


def split_pairs(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows 0..B-1 (chosen, or the feedback rows) and B..2B-1 (rejected, or KTO's KL rows) of a ``(2B, ...)`` value."""
    half = values.shape[0] // 2
    return values[:half], values[half:]


def as_pairs(batch: dict) -> dict:
    """``batch`` as pairs: as it is when it holds two rows per weight (the data side's), else (the memory model's
    synthetic rows, one weight per row) each row twice, so that m synthetic examples are m pairs."""
    weight = batch.get("loss_weight")
    if weight is None or weight.shape[0] * 2 == batch["input_ids"].shape[0]:
        return batch
    return {k: torch.cat([v, v]) if k != "loss_weight" else v for k, v in batch.items()}


@dataclass(frozen=True)
class PairLogps:
    """The policy's (and, when there is one, the reference's) log-probs of the chosen and rejected completions of B
    pairs, and the completions' lengths."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_len: torch.Tensor
    rejected_len: torch.Tensor
    ref_chosen: torch.Tensor | None = None
    ref_rejected: torch.Tensor | None = None


def dpo(p: PairLogps, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """DPO (sigmoid): -log sigmoid(beta h) (1 - eps) - log sigmoid(-beta h) eps, h = the policy's log-ratio of chosen
    over rejected minus the reference's; eps = ``label_smoothing`` (conservative DPO, Mitchell 2023)."""
    h = (p.chosen - p.rejected) - (p.ref_chosen - p.ref_rejected)
    return -F.logsigmoid(beta * h) * (1 - label_smoothing) - F.logsigmoid(-beta * h) * label_smoothing


def ipo(p: PairLogps, beta: float) -> torch.Tensor:
    """IPO (Azar 2023): (h - 1 / (2 beta))², h on length-averaged log-probs (as TRL: log-probs / completion length)."""
    h = (p.chosen / p.chosen_len - p.rejected / p.rejected_len) - \
        (p.ref_chosen / p.chosen_len - p.ref_rejected / p.rejected_len)
    return (h - 1 / (2 * beta)) ** 2


def simpo(p: PairLogps, beta: float, gamma: float) -> torch.Tensor:
    """SimPO (Meng 2024), no reference: -log sigmoid(beta (chosen / |chosen| - rejected / |rejected|) - gamma)."""
    return -F.logsigmoid(beta * (p.chosen / p.chosen_len - p.rejected / p.rejected_len) - gamma)


def orpo(p: PairLogps, beta: float) -> torch.Tensor:
    """ORPO (Hong 2024), no reference: the chosen completion's mean token NLL - beta log sigmoid(log odds ratio), the
    odds of a completion exp(a) / (1 - exp(a)) with a its mean token log-prob. TRL takes the NLL as the token mean
    over the batch's chosen completions; here it is each pair's own mean, so that the loss is a mean over pairs."""
    a, b = p.chosen / p.chosen_len, p.rejected / p.rejected_len
    log_odds = (a - b) - (torch.log1p(-torch.exp(a)) - torch.log1p(-torch.exp(b)))
    return -a - beta * F.logsigmoid(log_odds)


def kto(logps: torch.Tensor, ref_logps: torch.Tensor, kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor,
        desirable: torch.Tensor, beta: float, desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0) -> torch.Tensor:
    """KTO (Ethayarajh 2024) per feedback row: desirable w_d (1 - sigmoid(beta (r - z))), undesirable
    w_u (1 - sigmoid(beta (z - r))), r = the row's log-ratio, z = max(0, the log-ratio of its KL row) detached (the
    reference point). TRL's z is the mean over the batch's KL rows, which changes with the batch layout; here it is
    each row's own KL row (the same in expectation), so that 1 x 4 == 2 x 2 holds."""
    r = logps - ref_logps
    z = (kl_logps - ref_kl_logps).detach().clamp(min=0)
    good = desirable.bool()
    return torch.where(good, desirable_weight * (1 - torch.sigmoid(beta * (r - z))),
                       undesirable_weight * (1 - torch.sigmoid(beta * (z - r))))


def bradley_terry(chosen: torch.Tensor, rejected: torch.Tensor, center: float = 0.0) -> torch.Tensor:
    """A reward model's pairwise loss: -log sigmoid(r_chosen - r_rejected), plus ``center`` x (r_chosen +
    r_rejected)² (reward centring, TRL's center_rewards_coefficient, Eisenstein 2023)."""
    loss = -F.logsigmoid(chosen - rejected)
    return loss + center * (chosen + rejected) ** 2 if center else loss


def rewards(p: PairLogps, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) rewards as TRL reports them: beta x the log-ratio to the reference; without a reference,
    beta x the length-normalised log-prob (CPO/SimPO/ORPO)."""
    if p.ref_chosen is None:
        return beta * p.chosen / p.chosen_len, beta * p.rejected / p.rejected_len
    return beta * (p.chosen - p.ref_chosen), beta * (p.rejected - p.ref_rejected)


PAIR_LOSSES = {  # name -> per-pair loss of (PairLogps, beta, gamma, label_smoothing)
    "dpo": lambda p, beta, gamma, eps: dpo(p, beta, eps),
    "ipo": lambda p, beta, gamma, eps: ipo(p, beta),
    "simpo": lambda p, beta, gamma, eps: simpo(p, beta, gamma),
    "orpo": lambda p, beta, gamma, eps: orpo(p, beta),
}


def pair_loss(name: str, p: PairLogps, *, beta: float, gamma: float = 0.5, label_smoothing: float = 0.0) -> torch.Tensor:
    """The per-pair loss of ``name`` (dpo, ipo, simpo, orpo)."""
    return PAIR_LOSSES[name](p, beta, gamma, label_smoothing)
