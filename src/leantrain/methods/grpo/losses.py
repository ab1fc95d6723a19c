"""GRPO's losses as pure tensor functions: group-relative advantages (or RLOO's leave-one-out ones), the clipped
surrogate per token, the k3 KL estimate, and the four ways of summing token losses into the loss (TRL's
``GRPOTrainer``: ``_compute_loss`` and ``_generate_and_score_completions``; the names and numbers its users know).

Shapes: a rollout of N prompts x G completions is ``N*G`` rows, row ``i*G + j`` prompt i's j-th completion. Token
values are ``(rows, T)`` over the shifted targets of a training sequence; ``mask`` is 1 on completion tokens (0 on the
prompt, the padding, and every token of a truncated completion under ``grpo.mask_truncated``); ``weights`` are the rows'
``loss_weight`` (0 for padding rows, which only keep processes in step).

The loss is ``sum / count`` over the global batch (every micro-batch of the optimizer step, every process): each
micro-batch gives ``step.loss_sum`` and ``count`` (``reduce`` / ``count``) and the engine divides the sum of the sums by the
sum of the counts. So for ``dapo`` (tokens), ``grpo`` (sequences, each its own token mean) and ``dr_grpo`` (sequences x
``max_new_tokens``) the loss and its gradient are the same whatever the micro-batches and processes (1x4 == 2x2 ==
4x1). ``bnpo`` is each micro-batch's token mean, averaged over the micro-batches (TRL's definition): its value depends
on how the rows are split into micro-batches, as in TRL.
"""

from __future__ import annotations

import torch

LOSSES = ("dapo", "grpo", "dr_grpo", "bnpo")
BASELINES = ("grpo", "rloo")  # grpo.advantage
STD_EPS = 1e-4  # TRL: advantages / (std + 1e-4)


def nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The standard deviation with Bessel's correction, NaN left out (TRL's ``nanstd``); NaN for fewer than 2
    values."""
    mean = values.nanmean(dim=dim, keepdim=True) if dim is not None else values.nanmean()
    count = (~values.isnan()).sum(dim=dim) if dim is not None else (~values.isnan()).sum()
    variance = ((values - mean) ** 2).nanmean(dim=dim) * count / (count - 1)
    return torch.where(count > 1, variance, torch.full_like(variance, float("nan"))).sqrt()


def moments(rewards: torch.Tensor) -> torch.Tensor:
    """``[sum, sum of squares, count]`` of the non-NaN rewards (fp64): summed over processes, ``std_of`` gives the
    global batch's standard deviation (``scale_rewards=batch``)."""
    r = rewards.double()
    seen = ~r.isnan()
    r = torch.where(seen, r, torch.zeros_like(r))
    return torch.stack([r.sum(), (r * r).sum(), seen.sum().double()])


def std_of(m: torch.Tensor) -> torch.Tensor:
    """The Bessel-corrected standard deviation of values with ``moments`` ``m`` (NaN for fewer than 2)."""
    total, squares, n = m[0], m[1], m[2]
    if n < 2:
        return torch.full_like(total, float("nan"))
    return ((squares - total * total / n) / (n - 1)).clamp(min=0).sqrt()


def advantages(rewards: torch.Tensor, num_generations: int, scale: str, batch_std: torch.Tensor | None = None,
               baseline: str = "grpo") -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, std) per row of ``rewards (N*G,)`` (NaN: an unscorable completion, every function None): the
    reward less its baseline, divided by ``std + 1e-4`` unless ``scale`` is ``none``; ``std`` is the group's
    (``group``, ``none``) or the global batch's (``batch``: ``batch_std``, else these rewards'), repeated per row
    (``frac_reward_zero_std`` reads it). The baseline (``grpo.advantage``) is the group's mean (``grpo``) or the mean
    of the group's other rows (``rloo``, leave-one-out: ``n/(n-1)`` x the ``grpo`` difference for a group of ``n``
    scored rows), NaN left out either way. An unscorable row's advantage is 0, and under ``rloo`` so is that of a row
    with no other scored row in its group (nothing to compare it with)."""
    grouped = rewards.view(-1, num_generations)
    if baseline == "rloo":
        adv = leave_one_out(grouped).flatten()
    elif baseline == "grpo":
        adv = rewards - grouped.nanmean(dim=1).repeat_interleave(num_generations)
    else:
        raise ValueError(f"unknown GRPO advantage {baseline!r}; one of {', '.join(BASELINES)}")
    if scale == "batch":
        std = (nanstd(rewards) if batch_std is None else batch_std.to(rewards)).expand_as(rewards)
    else:
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations)
    if scale != "none":
        adv = adv / (std + STD_EPS)
    return torch.nan_to_num(adv, nan=0.0), std


def leave_one_out(grouped: torch.Tensor) -> torch.Tensor:
    """``(N, G)``: each reward less the mean of the other non-NaN rewards of its row (RLOO's baseline); NaN where the
    reward is NaN or no other reward of its row is scored."""
    seen = ~grouped.isnan()
    total = torch.where(seen, grouped, torch.zeros_like(grouped)).sum(dim=1, keepdim=True)
    others = seen.sum(dim=1, keepdim=True) - 1  # a scored row's scored peers (a NaN row's value is NaN anyway)
    mean_of_others = (total - grouped) / others.clamp(min=1)
    return torch.where(others > 0, grouped - mean_of_others, torch.full_like(grouped, float("nan")))


def surrogate(logps: torch.Tensor, old_logps: torch.Tensor, adv: torch.Tensor, epsilon: float,
              epsilon_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token loss, clipped) of the clipped surrogate: ``-min(ratio * A, clip(ratio, 1 - epsilon, 1 +
    epsilon_high) * A)`` with ``ratio = exp(logps - old_logps)`` and ``adv (rows,)``; ``clipped`` the tokens whose
    ratio is outside the range on the side the advantage pushes it (TRL's ``clip_ratio/region_mean``)."""
    ratio = torch.exp(logps - old_logps)
    a = adv.unsqueeze(1).to(ratio)
    loss = -torch.min(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high) * a)
    clipped = ((ratio < 1 - epsilon) & (a < 0)) | ((ratio > 1 + epsilon_high) & (a > 0))
    return loss, clipped


def kl_k3(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """The k3 estimate of KL(policy || reference) per token: ``exp(ref - logp) - (ref - logp) - 1`` (>= 0)."""
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1


def live(weights: torch.Tensor) -> torch.Tensor:
    """1 for the rows that count (weight not 0: padding rows weigh 0), 0 for the others."""
    return (weights != 0).to(torch.float32)


def count(mask: torch.Tensor, weights: torch.Tensor, loss: str, max_new_tokens: int) -> torch.Tensor:
    """The loss's denominator this micro-batch adds: completion tokens (dapo), sequences (grpo), sequences x
    ``max_new_tokens`` (dr_grpo), 1 (bnpo: one micro-batch). Padding rows add none."""
    rows = live(weights)
    if loss == "dapo":
        return (mask.float().sum(-1) * rows).sum()
    if loss == "grpo":
        return rows.sum()
    if loss == "dr_grpo":
        return rows.sum() * max_new_tokens
    if loss == "bnpo":
        return torch.ones((), device=mask.device)
    raise ValueError(f"unknown GRPO loss {loss!r}; one of {', '.join(LOSSES)}")


def reduce(per_token: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor, loss: str) -> torch.Tensor:
    """The micro-batch's loss sum, to be divided by the global sum of ``count``: each row's masked token losses,
    summed (dapo, dr_grpo), or as the row's token mean (grpo), or the micro-batch's token mean (bnpo), weighted by the
    rows' ``weights``."""
    mask = mask.to(per_token)
    tokens = (per_token * mask).sum(-1)
    w = weights.to(per_token)
    if loss in ("dapo", "dr_grpo"):
        return (tokens * w).sum()
    if loss == "grpo":
        return (tokens / mask.sum(-1).clamp(min=1.0) * w).sum()
    if loss == "bnpo":
        return (tokens * w).sum() / (mask.sum(-1) * live(weights).to(mask)).sum().clamp(min=1.0)
    raise ValueError(f"unknown GRPO loss {loss!r}; one of {', '.join(LOSSES)}")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, count) of token ``values`` over the completion tokens of the rows that count: a step metric's pair (its
    mean over the micro-batches, steps and processes is exact)."""
    m = mask.to(torch.float32) * live(weights).unsqueeze(1)
    return (values.float() * m).sum(), m.sum()


RATIO_BAND = (0.9, 1.1)  # sampling/ratio_outside: the share of tokens whose trainer/sampler ratio leaves this band


def sampling_metrics(logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor,
                     weights: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """How far the sampler's log-probs of the completion tokens are from the trainer's (``logps``, detached): the
    mean and the largest absolute difference, and the share of tokens whose ratio ``exp(logps - sampler_logps)``
    is outside ``RATIO_BAND`` (TRL #6789 counts the same for vLLM in bf16)."""
    diff = (logps.detach().float() - sampler_logps.float())
    m = mask.to(torch.float32) * live(weights).unsqueeze(1)
    ratio = diff.exp()
    outside = ((ratio < RATIO_BAND[0]) | (ratio > RATIO_BAND[1])).float()
    peak = (diff.abs() * m).max() if m.numel() else diff.new_zeros(())
    return {"sampling/logp_diff_mean": masked_sum(diff.abs(), mask, weights), "sampling/logp_diff_max": (peak, m.sum()),
            "sampling/ratio_outside": masked_sum(outside, mask, weights)}


def truncated_ratio(logps: torch.Tensor, sampler_logps: torch.Tensor, cap: float) -> torch.Tensor:
    """The truncated importance-sampling weight per token, ``min(exp(logps - sampler_logps), cap)``, detached (TRL's
    token-level correction of the sampler's mismatch: the loss was meant for the trainer's distribution)."""
    return (logps.detach() - sampler_logps).exp().clamp(max=cap)
