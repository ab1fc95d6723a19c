"""The generation engine: ``generate`` continues left-padded prompts token by token, for every caller (GRPO's
rollouts and evaluation, ``leantrain generate`` and sample prompts through ``continuations``).

One prefill forward of the N left-padded prompts (position ids from the attention mask, so absolute-position models
such as GPT-2 see each prompt start at 0), the KV cache and the last prompt logits then repeated G times per prompt
(the prompts are encoded once, not G times) into a cache with room reserved for every new token, kept in the dtype
attention reads (``reserved_cache``: no copy of the whole cache per token, no cast of it per token under autocast),
then decoding token by token with the cache through the step ``decode_step`` chooses (the fused step of
``fast_decode`` for Llama-shaped models, else the model's own forward). Each token is ``sampling.pick``'s: greedy at
temperature 0, else a draw from the caller's generator. A row stops at its first EOS (any of ``eos_ids``; ``stop_ids``
gathers them): later positions are ``pad_id`` with mask 0; decoding stops when every row has stopped or at
``max_new_tokens``. Long decoding reports its progress (positions, new tokens, rows done, tokens/s, time left) to
the open ``heartbeat`` sink: rank 0's progress, a line every few seconds; nothing is read from the device for it
between two lines.

The model is used as it is: the DDP wrapper's ``.module``, peft's LoRA model with its adapters active, under
whatever autocast the caller opened; in eval mode under ``no_grad`` (the mode restored after), no copy of the
weights but the fused step's. Autocast keeps the low-precision copy of a weight for its whole context only when the
weight is a leaf that requires grad: the frozen weights (LoRA's base model) would be cast again at every decoded
token, so they are marked as requiring grad for the generation (``casts_kept``: under ``no_grad`` nothing records a
graph; the same copies, cast once) and put back after. ``backends.backend`` picks this engine or vLLM's (``vllm_engine``) for GRPO.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

from leantrain.heartbeat import work
from leantrain.modeling.chunked_loss import keeps_logits
from leantrain.modeling.fast_paths import DECODE_STEP, decided
from leantrain.modeling.generation import cache_names
from leantrain.modeling.generation.decode_step import decode_step
from leantrain.modeling.generation.reserved_cache import compactable, keep_rows, reserve
from leantrain.modeling.generation.sampling import Sampling, pick
from leantrain.modeling.wrappers import frozen_forward, unwrapped

log = logging.getLogger("leantrain")
COMPACT_AT = 0.25  # the share of the decoding rows that must have ended before the batch drops them


@dataclass
class Rollout:
    """The completions of N prompts x G generations; row ``i*G + j`` is prompt i's j-th sample."""

    completion_ids: torch.Tensor  # (N*G, C) long, right-padded with pad_id
    completion_mask: torch.Tensor  # (N*G, C) 1 on the generated tokens up to and including the first EOS
    truncated: torch.Tensor  # (N*G,) bool: no EOS within max_new_tokens
    logps: torch.Tensor | None = None  # (N*G, C) fp32: the sampler's log-prob of each token (the model's own
    # distribution: temperature 1, no top-k/top-p, as training computes it), 0 after a row's EOS; None: not kept
    trained: torch.Tensor | None = None  # (N*G, C) bool: the tokens the model wrote (multi-turn episodes: not the
    # environment's, which it reads but is not trained on); None: every token of the mask


def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, num_generations: int,
             sampling: Sampling, eos_ids, pad_id: int, generator: torch.Generator | None = None,
             what: str | None = None, stop: Callable[..., torch.Tensor] | None = None) -> Rollout:
    """``num_generations`` completions of each left-padded prompt of ``prompt_ids`` (N, P), ``prompt_mask`` (N, P);
    ``generator`` on the model's device (None: torch's global one); ``what``: the progress line's name of the work;
    ``stop``: what ends a row beside its EOS (``stops.StopStrings``). A
    prompt row that is all padding gets finite logits and completions like any other (its loss weight is the
    caller's business)."""
    model = unwrapped(model)
    eos = torch.as_tensor(list(eos_ids), dtype=torch.long, device=prompt_ids.device)
    with frozen_forward(model), casts_kept(model):
        logits, cache = prefill(model, prompt_ids, prompt_mask)
        reserve(cache, num_generations, capacity=prompt_ids.shape[1] + sampling.max_new_tokens)
        logits = logits.repeat_interleave(num_generations, dim=0)
        mask = prompt_mask.long().repeat_interleave(num_generations, dim=0)
        choice = decode_step(model, cache, decided(model, DECODE_STEP))  # the run's choice (engine/devices/paths.py)
        log.debug("generation: the %s decode step (%s)", choice.name, choice.reason)
        what = what or f"generation of {mask.shape[0]} rows"
        return decode(choice.step, logits, mask, sampling, eos, pad_id, generator, what, cache, stop)


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
    last = {"logits_to_keep": 1} if keeps_logits(model) else {}
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
                use_cache=True, **last)
    return out.logits[:, -1].float(), cache_names.returned(out)


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0 at each row's first real token (padding at 0 too)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def decode(step: Callable[..., torch.Tensor], logits: torch.Tensor, mask: torch.Tensor, sampling: Sampling,
           eos: torch.Tensor, pad_id: int, generator: torch.Generator | None, what: str, cache=None,
           stop: Callable[..., torch.Tensor] | None = None,
           set_aside: Callable[..., None] | None = None) -> Rollout:
    """Token-by-token decoding from the prompts' last logits; ``mask`` (B, P) the prompts' attention mask; ``step``
    (token, position, mask) -> the next logits, the token's keys and values added to ``cache``. A row ends at an EOS
    or where ``stop`` (``stops.StopStrings``: (ids, rows, taken) -> a bool per decoding row) says its text ended.

    Rows that ended leave the batch: once a quarter of the rows still decoding have ended (``COMPACT_AT``), the
    others' tokens, positions, masks and cache rows are kept and theirs dropped (a reserved cache, ``keep_rows``; any
    other cache keeps every row to the end), so a batch no longer computes every row until the longest completion
    ends. Each dropped row's completion is already written; its later positions are ``pad_id`` with mask 0. The rows
    left draw the numbers they would have drawn in the whole batch (``sampling.pick``'s ``rows``). ``set_aside(cache,
    live, finished)`` is told before rows are dropped (``turns``: the dropped rows' cache kept for their next turn)."""
    rows, length = mask.shape
    steps = sampling.max_new_tokens
    ids = torch.full((rows, steps), pad_id, dtype=torch.long, device=mask.device)
    logps = torch.zeros((rows, steps), dtype=torch.float32, device=mask.device)
    ends = torch.full((rows,), steps, dtype=torch.long, device=mask.device)  # each row's completion length
    live = torch.arange(rows, device=mask.device)  # the row of ``ids`` each decoding row writes
    finished = torch.zeros(rows, dtype=torch.bool, device=mask.device)  # per decoding row
    attention = torch.cat([mask, mask.new_ones(rows, steps)], dim=1)
    position = mask.sum(-1, keepdim=True)  # the next token's position per row
    shrinks = compactable(cache)
    with work(what, steps, "positions", may_end_early=True) as progress:
        for taken in range(1, steps + 1):
            token = torch.where(finished, pad_id, pick(logits, sampling, generator, (rows, live)))
            ids[live, taken - 1] = token
            logps[live, taken - 1] = token_logps(logits, token).masked_fill(finished, 0.0)
            ended = torch.isin(token, eos)
            if stop is not None:
                ended |= stop(ids, live, taken)
            ended &= ~finished
            ends[live] = torch.where(ended, taken, ends[live])
            finished |= ended
            decoding = int((~finished).sum())  # the one host read per token: whether to go on (and to compact)
            if taken == steps or decoding == 0:
                break
            if shrinks and len(live) - decoding >= max(1, int(len(live) * COMPACT_AT)):
                if set_aside is not None:
                    set_aside(cache, live, finished)
                keep = torch.nonzero(~finished)[:, 0]
                live, finished, token, position, attention = (t[keep] for t in (live, finished, token, position,
                                                                                 attention))
                keep_rows(cache, keep)
            if progress.due():  # a clock read; the counts only when a line is wanted (rank 0, every few seconds)
                progress.update(taken, {"new tokens": int(ends.clamp(max=taken).sum()),
                                        "rows done": rows - decoding})
            logits, position = step(token, position, attention[:, :length + taken]), position + 1
    ids, ended_rows = ids[:, :taken], ends < steps
    ended_rows[live] |= finished  # a row that ended at the last position
    completion = (torch.arange(taken, device=ids.device) < ends.clamp(max=taken)[:, None]).long()
    return Rollout(ids, completion, ~ended_rows, logps[:, :taken])


def token_logps(logits: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """The log-prob of ``token`` (rows,) under each row's ``logits`` (rows, V), in fp32: what the sampler reports."""
    logits = logits.float()
    return logits.gather(-1, token[:, None])[:, 0] - logits.logsumexp(-1)


def stop_ids(model, tokenizer) -> list[int]:
    """The ids that end a completion: the tokenizer's EOS and every EOS of the model's generation config."""
    found = getattr(getattr(unwrapped(model), "generation_config", None), "eos_token_id", None)
    ids = [getattr(tokenizer, "eos_token_id", None)] + (found if isinstance(found, list) else [found])
    return sorted({int(i) for i in ids if i is not None})


def pad_id(tokenizer) -> int:
    """The id after a row's EOS and left of a short prompt: the pad token's, else the EOS token's, else 0."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad if pad is not None else getattr(tokenizer, "eos_token_id", None) or 0)

