"""Generation for online methods (GRPO): ``num_generations`` sampled completions per prompt with the current model.

One prefill forward of the N left-padded prompts (position ids from the attention mask, so absolute-position models
such as GPT-2 see each prompt start at 0), the KV cache and the last prompt logits then repeated G times per prompt
(the prompts are encoded once, not G times) into a cache with room reserved for every new token, kept in the dtype
attention reads (``reserved_cache``: no copy of the whole cache per token, no cast of it per token under autocast),
then decoding token by token with the cache: for Llama-family models by ``fast_decode.Decoder`` (the same forward
from the weights directly, a fraction of the operations per token), else by the model's own forward. Sampling is
HF's: fp32 logits / temperature, then top-k, then top-p (the smallest set of tokens whose probability reaches
``top_p``, at least one), then one draw per row (``draw``: one uniform number per row) with the caller's generator
(loop state, so a resumed run draws the same tokens); temperature 0 is greedy. A row stops at its first EOS (any of
``eos_ids``): later positions are ``pad_id`` with mask 0; decoding stops when every row has stopped or at
``max_new_tokens``. Long decoding reports its progress (positions, new tokens, rows done, tokens/s, time left) to
the open ``heartbeat`` sink: rank 0's progress, a line every few seconds; nothing is read from the device for it
between two lines.

The model is used as it is: the DDP wrapper's ``.module``, peft's LoRA model with its adapters active, under
whatever autocast the caller opened; in eval mode under ``no_grad`` (the mode restored after), no copy of the
weights. Autocast keeps the low-precision copy of a weight for its whole context only when the weight is a leaf that
requires grad: the frozen weights (LoRA's base model) would be cast again at every decoded token, so they are marked
as requiring grad for the generation (``casts_kept``: under ``no_grad`` nothing records a graph; the same copies, cast
once) and put back after. ``backend`` is the seam where another engine (vLLM) plugs in.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

from leantrain.errors import ConfigError, UserError
from leantrain.heartbeat import work
from leantrain.modeling.generation import fast_decode
from leantrain.modeling.generation.reserved_cache import reserve
from leantrain.modeling.wrappers import frozen_forward, unwrapped


@dataclass(frozen=True)
class Sampling:
    """How completions are drawn: ``temperature`` 0 is greedy; ``top_k`` 0 and ``top_p`` 1 are off."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


@dataclass
class Rollout:
    """The completions of N prompts x G generations; row ``i*G + j`` is prompt i's j-th sample."""

    completion_ids: torch.Tensor  # (N*G, C) long, right-padded with pad_id
    completion_mask: torch.Tensor  # (N*G, C) 1 on the generated tokens up to and including the first EOS
    truncated: torch.Tensor  # (N*G,) bool: no EOS within max_new_tokens


def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, num_generations: int,
             sampling: Sampling, eos_ids, pad_id: int, generator: torch.Generator | None = None) -> Rollout:
    """``num_generations`` completions of each left-padded prompt of ``prompt_ids`` (N, P), ``prompt_mask`` (N, P);
    ``generator`` on the model's device (None: torch's global one). A prompt row that is all padding gets finite
    logits and completions like any other (its loss weight is the caller's business)."""
    model = unwrapped(model)
    eos = torch.as_tensor(list(eos_ids), dtype=torch.long, device=prompt_ids.device)
    with frozen_forward(model), casts_kept(model):
        logits, cache = prefill(model, prompt_ids, prompt_mask)
        reserve(cache, num_generations, capacity=prompt_ids.shape[1] + sampling.max_new_tokens)
        logits = logits.repeat_interleave(num_generations, dim=0)
        mask = prompt_mask.long().repeat_interleave(num_generations, dim=0)
        step = fast_decode.decoder(model, cache) or transformers_step(model, cache)
        return decode(step, logits, mask, sampling, eos, pad_id, generator)


def transformers_step(model, cache) -> Callable[..., torch.Tensor]:
    """The decode step through the model's own forward: fp32 logits (rows, V) of one token per row (``Decoder``'s
    signature)."""
    def step(token: torch.Tensor, position: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=position, cache=cache, use_cache=True)
        return out.logits[:, -1].float()
    return step


@contextmanager
def casts_kept(model):
    """Under an autocast that caches its casts, the frozen fp32 weights of ``model`` marked as requiring grad, so
    that each is cast once for the whole context instead of at every call (module docstring); put back after. Use
    it under ``no_grad``."""
    device = next(model.parameters()).device.type
    frozen = []
    if torch.is_autocast_enabled(device) and torch.is_autocast_cache_enabled():
        frozen = [p for p in model.parameters() if not p.requires_grad and p.dtype == torch.float32]
    try:
        for p in frozen:
            p.requires_grad_(True)
        yield model
    finally:
        for p in frozen:
            p.requires_grad_(False)


def prefill(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """One forward of the prompts: the last position's fp32 logits (N, V) and the KV cache."""
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
                use_cache=True, logits_to_keep=1)
    return out.logits[:, -1].float(), out.cache


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0 at each row's first real token (padding at 0 too)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def decode(step: Callable[..., torch.Tensor], logits: torch.Tensor, mask: torch.Tensor, sampling: Sampling,
           eos: torch.Tensor, pad_id: int, generator: torch.Generator | None) -> Rollout:
    """Token-by-token decoding from the prompts' last logits; ``mask`` (B, P) the prompts' attention mask; ``step``
    (token, position, mask) -> the next logits, the token's keys and values added to the cache it decodes on."""
    rows, length = mask.shape
    steps = sampling.max_new_tokens
    ids = torch.full((rows, steps), pad_id, dtype=torch.long, device=mask.device)
    done = torch.zeros(rows, dtype=torch.bool, device=mask.device)
    attention = torch.cat([mask, mask.new_ones(rows, steps)], dim=1)
    position = mask.sum(-1, keepdim=True)  # the next token's position per row
    with work(f"generation of {rows} rows", steps, "positions", may_end_early=True) as progress:
        for taken in range(1, steps + 1):
            token = torch.where(done, pad_id, pick(logits, sampling, generator))
            ids[:, taken - 1] = token
            done |= torch.isin(token, eos)
            if taken == steps or bool(done.all()):
                break
            if progress.due():  # a clock read; the counts only when a line is wanted (rank 0, every few seconds)
                progress.update(taken, {"new tokens": int(completion_mask(ids[:, :taken], eos).sum()),
                                        "rows done": int(done.sum())})
            logits, position = step(token, position, attention[:, :length + taken]), position + 1
    ids = ids[:, :taken]
    return Rollout(ids, completion_mask(ids, eos), ~done)


def completion_mask(ids: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """1 on each row's tokens up to and including its first EOS, 0 after (long, like attention masks)."""
    hit = torch.isin(ids, eos).long()
    return ((hit.cumsum(-1) - hit) == 0).long()


def pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row: the argmax at temperature 0, else a draw from the filtered distribution."""
    if sampling.temperature == 0:
        return logits.argmax(-1)
    scaled = logits if sampling.temperature == 1 else logits / sampling.temperature  # the same values: one pass less
    return draw(filtered(scaled, sampling.top_k, sampling.top_p).softmax(-1), generator)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of ``probs`` (rows, V), drawn from it by inverting its fp64 CDF at one uniform number per
    row: the first index whose cumulative probability exceeds it, so a token of probability 0 is never drawn.
    ``torch.multinomial`` draws one exponential per vocabulary entry instead: a third of the generation's time at
    49k words on a CPU (``benchmarks/results/grpo.md``)."""
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, dtype=torch.float64, device=probs.device, generator=generator) * total
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


def backend(name: str) -> Callable[..., Rollout]:
    """The generation engine of ``grpo.generation``: ``auto`` and ``transformers`` are this module's ``generate``."""
    if name in ("auto", "transformers"):
        return generate
    if name == "vllm":
        raise UserError("grpo.generation=vllm: vLLM is not wired into leantrain yet; use grpo.generation=auto "
                        "(transformers, with a KV cache)")
    raise ConfigError(f"grpo.generation={name!r}: expected auto, transformers or vllm")
