"""How the next token is chosen from a row's logits: ``Sampling`` (the settings) and ``pick`` (one token per row).

Temperature 0 is greedy (the argmax). Otherwise HF's order: fp32 logits / temperature, then top-k, then top-p (the
smallest set of tokens whose probability reaches ``top_p``, at least one; ``filtered``), then one draw per row
(``draw``: one uniform number per row) from the caller's ``torch.Generator`` (GRPO's is loop state, so a resumed run
draws the same tokens; ``leantrain generate --seed`` seeds one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """How completions are drawn: ``temperature`` 0 is greedy; ``top_k`` 0 and ``top_p`` 1 are off."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


def pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None,
         rows: tuple[int, torch.Tensor] | None = None) -> torch.Tensor:
    """One token per row: the argmax at temperature 0, else a draw from the filtered distribution. ``rows``: (the
    batch's rows, the ones ``logits`` are of), where some rows left the batch: a uniform number is drawn for every
    row of the batch and the remaining rows take theirs, so a row's draws do not depend on which others ended."""
    if sampling.temperature == 0:
        return logits.argmax(-1)
    scaled = logits if sampling.temperature == 1 else logits / sampling.temperature  # the same values: one pass less
    return draw(filtered(scaled, sampling.top_k, sampling.top_p).softmax(-1), generator, rows)


def draw(probs: torch.Tensor, generator: torch.Generator | None,
         rows: tuple[int, torch.Tensor] | None = None) -> torch.Tensor:
    """One index per row of ``probs`` (rows, V), drawn from it by inverting its fp64 CDF at one uniform number per
    row (``rows``: of these rows of a larger batch, ``pick``): the first index whose cumulative probability exceeds it,
    so a token of probability 0 is never drawn.
    ``torch.multinomial`` draws one exponential per vocabulary entry instead: a third of the generation's time at
    49k words on a CPU (``benchmarks/results/grpo.md``)."""
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:]
    if rows is None:
        u = torch.rand(total.shape, dtype=torch.float64, device=probs.device, generator=generator)
    else:
        u = torch.rand((rows[0], 1), dtype=torch.float64, device=probs.device, generator=generator)[rows[1]]
    u = u * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # below the total, whatever the rounding
    return torch.searchsorted(cdf, u, right=True)[:, 0]


def filtered(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """HF's top-k then top-p warpers: the logits of the dropped tokens set to -inf."""
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = logits.sort(-1)  # ascending: drop the low tail whose mass stays <= 1 - top_p
        tail = ordered.softmax(-1).cumsum(-1) <= 1 - top_p
        tail[..., -1] = False  # at least one token
        logits = logits.masked_fill(tail.scatter(-1, order, tail), float("-inf"))
    return logits


def seeded(device: torch.device, seed: int | None) -> torch.Generator:
    """A generator on ``device`` seeded with ``seed`` (None: a fresh, non-deterministic seed); the global random
    state is not touched."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
