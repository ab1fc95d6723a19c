"""What one GRPO step trains on, made from a micro-batch of prompts: the completions sampled by the model
(``leantrain.modeling.generation``), their rewards (``rewards``), and the training rows built from them.

A training micro-batch is the N prompts as they were generated from (left-padded, ``prompt_input_ids`` /
``prompt_attention_mask``) and their N*G completions (``completion_ids``, right-padded to the longest, up to and
including each one's EOS; ``completion_mask``; ``completion_labels``: the tokens, -100 on the padding and on every
token of a truncated completion under ``grpo.mask_truncated``). Row ``i*G + j`` is prompt i's j-th completion: a
prompt's group is one micro-batch's, on one process. Its forward (``forward``) gives per-token values
``(rows, C)``, one per completion position.

``rollout_values`` (rows, K) carries each row's share of the rollout's metrics (``ROLLOUT_METRICS``, then one per
reward function), NaN where a row has none (an unscorable completion's reward): the step sums them over the rows
that count (``Grpo.step_loss``), so the logged means are exact over micro-batches, steps and processes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from leantrain.methods.grpo import episodes as E
from leantrain.methods.grpo import forward as F
from leantrain.methods.grpo import losses as L
from leantrain.methods.grpo import rewards as R

from leantrain.modeling.generation.decode import Rollout

IGNORE = F.IGNORE
SAMPLER_LOGPS = "sampler_logps"  # (rows, C) the sampler's log-probs of the completion tokens, when it reports them
# TRL's names; each row's value (reward_std: the step's global batch std on every row)
ENV_REWARD = "rewards/environment/mean"  # a multi-turn run's: the environment's reward, as a function's
ROLLOUT_METRICS = ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length",
                   "completions/clipped_ratio")


def metric_names(rewards: list[R.Reward], episodes: bool = False) -> tuple[str, ...]:
    """The names of ``rollout_values``' columns, in order; ``episodes``: a multi-turn run's (the environment's reward
    as one more function, then the episodes' statistics: ``episodes.STATS``)."""
    own = (ENV_REWARD, *E.STATS) if episodes else ()
    return (*ROLLOUT_METRICS, *(f"rewards/{r.name}/mean" for r in rewards), *own)


@dataclass
class Scored:
    """One micro-batch's completions, decoded and scored."""

    batch: dict  # the loaded prompt micro-batch
    rollout: Rollout
    texts: list[str]
    ids: list[list[int]]  # each completion's tokens (up to and including its EOS)
    scores: np.ndarray  # (rows, F), NaN where a function had no score
    rewards: torch.Tensor  # (rows,) fp64: the weighted sum, NaN for an unscorable completion
    live: torch.Tensor  # (rows,) bool: the rows of real prompts (not padding)
    episodes: E.Episodes | None = None  # multi-turn: the environment's rewards, the statistics, the messages


def repeat(values: list, times: int) -> list:
    return [v for v in values for _ in range(times)]


def joined_prompts(batches: list[dict], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The left-padded prompts of several micro-batches as one batch (ids, mask), each left-padded again to the
    longest: one generation for the step's prompts."""
    return (stacked([b["prompt_input_ids"] for b in batches], pad_id, left=True),
            stacked([b["prompt_attention_mask"] for b in batches], 0, left=True))


def stacked(parts: list[torch.Tensor], fill, left: bool) -> torch.Tensor:  # noqa: ANN001 - a number
    """``(rows, width)`` tensors as one, each padded with ``fill`` to the widest (on the left or the right)."""
    width = max(p.shape[1] for p in parts)
    pads = [(width - p.shape[1], 0) if left else (0, width - p.shape[1]) for p in parts]
    return torch.cat([torch.nn.functional.pad(p, pad, value=fill) for p, pad in zip(parts, pads)])


def split(rollout: Rollout, rows: list[int]) -> list[Rollout]:
    """A rollout of the joined prompts cut back into one per micro-batch (``rows`` each, in order)."""
    out, start = [], 0
    for n in rows:
        cut = slice(start, start + n)
        out.append(Rollout(*(None if t is None else t[cut] for t in (getattr(rollout, f.name) for f in
                                                                      dataclasses.fields(rollout)))))
        start += n
    return out


def split_episodes(episodes: E.Episodes, rows: list[int]) -> list[E.Episodes]:
    """The episodes of the joined prompts cut back into one set per micro-batch, as ``split``."""
    out, start = [], 0
    for part in split(episodes.rollout, rows):
        cut = slice(start, start + len(part.completion_ids))
        out.append(E.Episodes(part, episodes.answers[cut], episodes.env_rewards[cut], episodes.stats[cut],
                              episodes.messages[cut]))
        start = cut.stop
    return out


def score(batch: dict, rollout: Rollout, tokenizer, rewards: list[R.Reward], num_generations: int,
          step: int | str) -> Scored:
    """Decode the completions of one micro-batch and score them (each reward function once, host side); ``step``
    names when in an error (``rewards.score``)."""
    lengths = rollout.completion_mask.sum(-1).tolist()
    ids = [row[:n] for row, n in zip(rollout.completion_ids.tolist(), lengths)]
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    scores, combined, live = _scored(batch, texts, ids, rewards, num_generations, step)
    return Scored(batch, rollout, texts, ids, scores, torch.from_numpy(combined), live)


def score_episodes(batch: dict, episodes: E.Episodes, tokenizer, rewards: list[R.Reward], num_generations: int,
                   step: int | str) -> Scored:
    """A micro-batch's episodes scored: each one's reward is the environment's (the sum of what its steps returned)
    plus ``rewards``' weighted sum on its last answer, the None of either left out (NaN: neither had one; 0 when there
    are no reward functions: an episode its environment never rewarded, cut or out of turns, failed)."""
    trained = episodes.rollout.trained.cpu()
    ids = [row[keep].tolist() for row, keep in zip(episodes.rollout.completion_ids.cpu(), trained)]
    scores, own, live = _scored(batch, episodes.answers, ids, rewards, num_generations, step)
    env = episodes.env_rewards.numpy()
    both = np.stack([own, env], axis=1)
    combined = np.nansum(both, axis=1)
    if rewards:  # NaN where neither scored; without reward functions an episode the environment never rewarded
        combined[np.isnan(both).all(axis=1)] = np.nan  # (cut, out of turns) failed its task: 0
    return Scored(batch, episodes.rollout, episodes.answers, ids, np.concatenate([scores, env[:, None]], axis=1),
                  torch.from_numpy(combined), live, episodes)


def _scored(batch: dict, texts: list[str], ids: list[list[int]], rewards: list[R.Reward], num_generations: int,
            step: int | str) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """(each function's scores, their weighted sum: NaN where none scored, the rows of real prompts) of a micro-batch's
    completions ``texts`` / ``ids``, its prompts and columns repeated for their ``num_generations`` completions."""
    prompts = repeat(batch["prompt"], num_generations)
    columns = {k: repeat(v, num_generations) for k, v in (batch.get("columns") or {}).items()}
    scores = R.score(rewards, prompts, texts, ids, columns, conversational=not isinstance(prompts[0], str), step=step)
    combined = R.combine(scores, rewards)
    combined[np.isnan(scores).all(axis=1)] = np.nan  # unscorable: left out of its group's mean (TRL)
    live = batch["loss_weight"].repeat_interleave(num_generations) != 0
    return scores, combined, live.cpu()


def global_std(scored: list[Scored], accelerator) -> torch.Tensor:  # noqa: ANN001 - an Accelerator
    """The standard deviation of every reward of the step (all micro-batches and processes; TRL's ``reward_std``,
    and the scale of ``scale_rewards=batch``): one collective of three numbers."""
    m = sum(L.moments(s.rewards[s.live]) for s in scored)
    if accelerator.num_processes > 1:
        m = accelerator.reduce(m.to(accelerator.device), reduction="sum").cpu()
    return L.std_of(m)


def training_rows(s: Scored, adv: torch.Tensor, std: torch.Tensor, batch_std: torch.Tensor, pad_id: int,
                  mask_truncated: bool, num_generations: int) -> dict:
    """The training micro-batch of one scored micro-batch (see the module's docstring), on the prompts' device."""
    device = s.batch["prompt_input_ids"].device
    mask = s.rollout.completion_mask.long()
    width = max(1, int(mask.sum(-1).max()))  # the longest completion
    ids, mask = s.rollout.completion_ids[:, :width].masked_fill(mask[:, :width] == 0, pad_id), mask[:, :width]
    labels = ids.masked_fill(mask == 0, IGNORE)
    if s.rollout.trained is not None:  # an episode's environment tokens: read, not trained
        labels = labels.masked_fill(~s.rollout.trained[:, :width].to(labels.device), IGNORE)
    if mask_truncated:
        labels[s.rollout.truncated.to(labels.device)] = IGNORE
    rows = {F.PROMPT_IDS: s.batch["prompt_input_ids"], F.PROMPT_MASK: s.batch["prompt_attention_mask"],
            F.COMPLETION_IDS: ids.to(device), F.COMPLETION_MASK: mask.to(device),
            F.COMPLETION_LABELS: labels.to(device), "advantages": adv.float().to(device),
            "loss_weight": s.batch["loss_weight"].repeat_interleave(num_generations),
            "rollout_values": rollout_values(s, std, batch_std).to(device)}
    if s.rollout.logps is not None:  # the sampler's own log-probs: the off-policy metrics and correction
        rows[SAMPLER_LOGPS] = s.rollout.logps[:, :width].float().masked_fill(mask == 0, 0.0).to(device)
    return rows


def tokens(batch: dict) -> torch.Tensor:
    """The prompt + completion tokens of a training micro-batch's rows that count (tokens/s), as TRL counts them: each
    row's prompt without padding and its completion up to and including its EOS."""
    g = F.group_size(batch)
    prompt = batch[F.PROMPT_MASK].sum(-1).repeat_interleave(g)
    return ((prompt + batch[F.COMPLETION_MASK].sum(-1)) * (batch["loss_weight"] != 0)).sum()


def rollout_values(s: Scored, std: torch.Tensor, batch_std: torch.Tensor) -> torch.Tensor:
    """(rows, K) fp32: each row's reward, the step's reward std, whether its group's std is 0 (TRL's
    ``frac_reward_zero_std``; the batch's under scale_rewards=batch), its completion's length and truncation, and
    each function's score; NaN where a row has no value."""
    rows = len(s.ids)
    zero_std = torch.isclose(std, torch.zeros_like(std)).double()
    columns = [s.rewards, batch_std.double().expand(rows), zero_std,
               s.rollout.completion_mask.sum(-1).double().cpu(), s.rollout.truncated.double().cpu(),
               *torch.from_numpy(s.scores).T, *([] if s.episodes is None else s.episodes.stats.T)]
    return torch.stack([c.double() for c in columns], dim=1).float()


def rollout_metrics(values: torch.Tensor, weights: torch.Tensor, names: tuple[str, ...]) -> dict:
    """``{name: (sum, count)}`` of a training micro-batch's ``rollout_values`` over the rows that count, NaN left
    out."""
    seen = ~values.isnan() & (weights != 0).unsqueeze(1)
    totals = torch.where(seen, values, torch.zeros_like(values)).sum(0)
    counts = seen.float().sum(0)
    return {n: (totals[k], counts[k]) for k, n in enumerate(names)}


def samples(s: Scored, rewards: list[R.Reward], limit: int) -> list[dict]:
    """The first ``limit`` completions of real prompts as ``completions.jsonl`` records."""
    out = []
    for i in torch.nonzero(s.live).flatten().tolist()[:limit]:
        prompt = s.batch["prompt"][i // (len(s.ids) // len(s.batch["prompt"]))]
        record = {"prompt": prompt, "completion": s.texts[i], "reward": number(s.rewards[i].item()),
                  "rewards": {r.name: number(s.scores[i, j]) for j, r in enumerate(rewards)}}
        if s.episodes is not None:  # the whole episode, and what it took
            record["rewards"]["environment"] = number(s.scores[i, len(rewards)])
            record["episode"] = s.episodes.messages[i]
            record.update({k.split("/")[1]: int(v) for k, v in zip(E.STATS, s.episodes.stats[i].tolist())})
        out.append(record)
    return out


def number(value: float) -> float | None:
    """A JSON value: None for NaN (no score)."""
    return None if math.isnan(value) else float(value)
