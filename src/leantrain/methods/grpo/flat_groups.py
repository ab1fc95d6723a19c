"""Groups with nothing to learn, left out of the forward and backward (``grpo.skip_zero_advantage=auto``).

A group whose completions all got the same reward has every advantage 0 (``losses.advantages``: the reward less its
group's mean, or the mean of its other rows). With ``beta = 0`` its rows' clipped surrogate is ``-min(ratio x 0,
clip(ratio) x 0) = 0`` whatever the model computes: their gradient is exactly 0, their forward and backward are pure
cost. A weak model on hard prompts (every completion wrong) or a strong one on easy prompts (every completion right)
makes most groups so (TRL's ``frac_reward_zero_std``); DAPO's dynamic sampling draws more prompts to replace them,
here they are only not computed.

What stays exactly as it was: the loss's denominator (``losses.count``, counted before on every row: a skipped
completion's tokens still count under ``dapo``), the tokens tokens/s credits, the rollout metrics (reward, its std,
``frac_reward_zero_std``, the lengths: every row's values go with the first training micro-batch,
``ROLLOUT_WEIGHTS``), the optimizer step (a process with no group left to train runs one token of a flat group
weighing 0 instead: every process runs as many forwards and backwards, every weight gets its gradient of 0 and the
optimizer steps as it would, Adam's moments included).
What changes: the loss and its gradient to rounding (the groups are trained in other micro-batches; under dropout
the masks drawn differ with the rows: the same gradient in distribution), and the token metrics of the forward
(``entropy``, ``clip_ratio``, ``sampling/*``) are over the trained groups (NaN on a step with none).

Never with ``beta > 0`` (the KL term has a gradient at advantage 0) or ``loss=bnpo`` (each micro-batch's token mean:
its value depends on the rows in it): ``skips``.
"""

from __future__ import annotations

import math

import torch

from leantrain.methods.grpo import forward as F
from leantrain.methods.grpo.rollout import stacked

ROLLOUT_WEIGHTS = "rollout_weights"  # (rows,) the weights of a micro-batch's ``rollout_values`` rows, when those are
# not its trained rows (skipped groups' values go with the first micro-batch)
PROMPT_KEYS = (F.PROMPT_IDS, F.PROMPT_MASK)  # (N, P), left-padded
ROW_FILL = {F.COMPLETION_MASK: 0, F.COMPLETION_LABELS: F.IGNORE}  # (N*G, C) right-padded; the ids with the pad id,
# any other (N*G, C) value (the sampler's log-probs) with 0


def skips(grpo) -> bool:  # noqa: ANN001 - a GrpoConfig
    """Whether a step leaves its flat groups out: ``grpo.skip_zero_advantage=auto`` where that changes nothing but
    rounding (``beta = 0``, a loss whose denominator is counted over the global batch)."""
    return grpo.skip_zero_advantage == "auto" and grpo.beta == 0 and grpo.loss != "bnpo"


def learning(rows: dict, num_generations: int) -> torch.Tensor:
    """(N,) bool: the groups of a training micro-batch with a row whose loss is not exactly 0: an advantage not 0 on
    a row that weighs (or a weight that is not finite: a NaN must reach the loss, as it would unskipped)."""
    w, adv = rows["loss_weight"], rows["advantages"].to(rows["loss_weight"].device)
    nothing = (w == 0) | ((adv == 0) & w.isfinite())
    return ~nothing.view(-1, num_generations).all(dim=1)


def trained(made: list[dict], num_generations: int, pad_id: int, accelerator) -> list[dict]:  # noqa: ANN001
    """The training micro-batches of a step without its flat groups: the learning groups of ``made`` (this process's
    micro-batches, as ``rollout.training_rows`` made them) packed into micro-batches of as many prompts, as many
    as the process that needs most needs, a process with fewer padded with one token of a flat group weighing 0
    (``weightless``); every row's rollout values go with the first. ``made`` itself when every group learns."""
    prompts = [b[F.PROMPT_IDS].shape[0] for b in made]
    flags = torch.cat([learning(b, num_generations) for b in made]).cpu().split(prompts)  # one host read
    keep = [(i, j) for i, f in enumerate(flags) for j in torch.nonzero(f).flatten().tolist()]
    flat = [(i, j) for i, f in enumerate(flags) for j in torch.nonzero(~f).flatten().tolist()]
    per = max(prompts)
    needed = agreed(max(1, math.ceil(len(keep) / per)), accelerator)
    if not flat:
        return made
    out = []
    for k in range(needed):
        groups = keep[k * per:(k + 1) * per]
        batch = gathered(made, groups, num_generations, pad_id) if groups else weightless(made, flat[0])
        batch["rollout_values"] = batch["rollout_values"][:0]
        batch[ROLLOUT_WEIGHTS] = batch["loss_weight"][:0]
        out.append(batch)
    out[0]["rollout_values"] = torch.cat([b["rollout_values"] for b in made])
    out[0][ROLLOUT_WEIGHTS] = torch.cat([b["loss_weight"] for b in made])
    return out


def weightless(made: list[dict], group: tuple[int, int]) -> dict:
    """A micro-batch that keeps a process with nothing more to learn in step: the first completion token of the
    first row of a flat ``group`` (its prompt whole), weighing 0: its forward and backward give every weight a gradient
    of exactly 0 at the cost of one token."""
    i, j = group
    row = j * F.group_size(made[i])  # the group's first
    cut = {"prompt": lambda v: v[j:j + 1], "tokens": lambda v: v[row:row + 1, :1], "rows": lambda v: v[row:row + 1],
           "other": lambda v: v}
    out = {key: cut[kind(key, value)](value) for key, value in made[i].items()}
    out["loss_weight"] = torch.zeros_like(out["loss_weight"])
    return out


def agreed(needed: int, accelerator) -> int:  # noqa: ANN001 - an Accelerator
    """The largest ``needed`` over the processes (one collective of one number where there are several): every
    process runs as many micro-batches (FSDP and DeepSpeed gather weights at each forward)."""
    if accelerator is None or accelerator.num_processes == 1:
        return needed
    n = torch.tensor([needed], device=accelerator.device)
    return int(accelerator.gather(n).max())


def gathered(made: list[dict], groups: list[tuple[int, int]], num_generations: int, pad_id: int) -> dict:
    """One training micro-batch of the groups ``(micro-batch, prompt)`` of ``made``: their prompts left-padded to the
    longest, their completions' per-token values right-padded to the longest (the ids with ``pad_id``, the mask with
    0, the labels ignored, the rest 0), their per-row values as they are."""
    g = num_generations
    out = {}
    for key, value in made[groups[0][0]].items():
        part = kind(key, value)
        if part == "prompt":
            out[key] = stacked([made[i][key][j:j + 1] for i, j in groups], pad_id if key == F.PROMPT_IDS else 0,
                               left=True)
        elif part == "other":
            out[key] = value
        else:
            rows = [made[i][key][j * g:(j + 1) * g] for i, j in groups]
            fill = pad_id if key == F.COMPLETION_IDS else ROW_FILL.get(key, 0)
            out[key] = stacked(rows, fill, left=False) if part == "tokens" else torch.cat(rows)
    return out


def kind(key: str, value) -> str:  # noqa: ANN001 - a tensor or anything a batch carries
    """What a training micro-batch's entry holds: ``prompt`` (N, P) left-padded, ``tokens`` (N*G, C) one value per
    completion position, ``rows`` (N*G, ...) one per completion, ``other`` (not per prompt or row)."""
    if key in PROMPT_KEYS:
        return "prompt"
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return "other"
    return "tokens" if value.dim() == 2 and key != "rollout_values" else "rows"
