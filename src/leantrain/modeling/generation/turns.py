"""Multi-turn generation with the KV cache kept between turns (GRPO's episodes, ``grpo.episode_cache=keep``).

A multi-turn episode's later turn continues a sequence whose every token but the last few was already through the
model: the prompt, the model's turns (decoded into the cache) and the environment's replies. Re-prefilling it (what
``decode.generate`` does when given the whole sequence) encodes all of it again, at every turn, for every episode
(the G episodes of a prompt no longer share their prefix). ``Turns`` keeps each row's cache instead:

- ``first`` is ``decode.generate``'s generation of the prompts (one prefill, G rows each, a reserved cache), with the
  rows that leave the decode batch (``decode``'s compaction) set aside, not dropped, so every row's cache survives
  the turn;
- ``next(rows, sequences)`` gathers the rows that go on (``reserved_cache.gathered``: a new reserved cache with room
  for the turn) and prefills only what the cache lacks of each sequence: the turn's last sampled token (never fed:
  its logits were the last the row needed) and the environment's reply, left-padded into one block for all rows,
  then decodes from it as ``decode.generate`` does.

A row's cache after a turn holds its sequence up to (not including) its last sampled token: ``valid`` marks those
positions (the prompt's mask, then the completion's tokens but the last); the positions after (the padding a
finished row was fed until it left the batch, the columns other rows decoded into) are masked, their keys and values
zeros. Position ids count a row's real tokens, as in the prefill, so a continued row sees the positions a re-prefill
would give it; its logits equal the re-prefill's to rounding (``tests/unit/modeling/test_turns.py``), not bit for
bit: the cached keys were computed one token at a time by the decode step, a re-prefill computes them in one
forward. Memory: every live episode's cache is held between turns (while the environment steps), where re-prefilling
frees it; ``benchmarks/results/grpo.md`` measures both.

``keep=False`` (``grpo.episode_cache=prefill``) re-prefills instead: a later turn is ``decode.generate`` on the
whole sequences, nothing held between turns. Only a cache whose layers are all reserved can be kept
(``reserved_cache.compactable``: plain full-attention layers); another is re-prefilled too (``Turns.kept`` says
which).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.nn.utils.rnn import pad_sequence

from leantrain.modeling.fast_paths import DECODE_STEP, decided
from leantrain.modeling.generation import cache_names
from leantrain.modeling.generation.decode import Rollout, casts_kept, decode, generate, positions, prefill
from leantrain.modeling.generation.decode_step import decode_step
from leantrain.modeling.generation.reserved_cache import compactable, gathered, reserve
from leantrain.modeling.generation.sampling import Sampling
from leantrain.modeling.wrappers import frozen_forward, unwrapped


class Turns:
    """The turns of one batch of episodes on ``model``, the cache kept between them (module docstring). ``first``,
    then ``next`` as many times as turns go on; each returns the turn's ``Rollout``, rows in the order asked."""

    def __init__(self, model, *, eos_ids, pad_id: int, generator: torch.Generator | None = None,  # noqa: ANN001
                 stop: Callable[..., torch.Tensor] | None = None, keep: bool = True):
        self.model, self.pad_id, self.generator, self.stop = unwrapped(model), pad_id, generator, stop
        self.eos, self.keep = list(eos_ids), keep
        self.cache = None
        self.pieces: list = []  # (rows of the turn, their layers' keys and values), set aside during the turn
        self.valid: torch.Tensor | None = None  # (rows of the last turn, positions) 1: the row's token is cached

    def first(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, num_generations: int,
              sampling: Sampling) -> Rollout:
        """The first turn: ``num_generations`` completions of each left-padded prompt (``decode.generate``'s)."""
        if not self.keep:
            return self._generated(prompt_ids, prompt_mask, num_generations, sampling)
        with frozen_forward(self.model), casts_kept(self.model):
            logits, self.cache = prefill(self.model, prompt_ids, prompt_mask)
            reserve(self.cache, num_generations, capacity=prompt_ids.shape[1] + sampling.max_new_tokens)
            mask = prompt_mask.long().repeat_interleave(num_generations, dim=0)
            return self._decoded(logits.repeat_interleave(num_generations, dim=0), mask, sampling)

    @property
    def kept(self) -> bool:
        """Whether the cache is kept for the next turn: asked for (``keep``), and every layer of it reserved (module
        docstring)."""
        return self.keep and self.cache is not None and compactable(self.cache)

    def next(self, rows: list[int], sequences: list[list[int]], *, sampling: Sampling) -> Rollout:
        """A later turn of the last turn's rows ``rows`` (indices, in the order wanted), each continuing
        ``sequences[k]``: its whole sequence so far (prompt, every turn, the environment's replies), of which the
        cache already holds the start (``valid``); the rest is prefilled, then decoded. Where the cache is not
        ``kept``, each sequence is encoded again whole (``decode.generate``)."""
        if not self.kept:
            ids, mask = self._left_padded(sequences, self.model.get_output_embeddings().weight.device)
            return self._generated(ids, mask, 1, sampling)
        taken = torch.as_tensor(rows, dtype=torch.long, device=self.valid.device)
        valid = self.valid.index_select(0, taken)
        fresh = [s[int(n):] for s, n in zip(sequences, valid.sum(-1).tolist())]
        if any(not f for f in fresh):
            raise ValueError("turns: a sequence holds nothing the cache lacks (its last sampled token at least)")
        length = int(valid.any(0).nonzero().max()) + 1 if valid.any() else 0
        block, block_mask = self._left_padded(fresh, valid.device)
        width = block.shape[1]
        mask = torch.cat([valid[:, :length], block_mask], dim=1)
        self._gather(taken, length, capacity=length + width + sampling.max_new_tokens)
        with frozen_forward(self.model), casts_kept(self.model):
            logits = self._prefilled(block, mask)
            return self._decoded(logits, mask, sampling)

    def _generated(self, ids: torch.Tensor, mask: torch.Tensor, num_generations: int, sampling: Sampling) -> Rollout:
        """``decode.generate`` of left-padded ``ids``: nothing kept after it."""
        return generate(self.model, ids, mask, num_generations=num_generations, sampling=sampling, eos_ids=self.eos,
                        pad_id=self.pad_id, generator=self.generator, stop=self.stop)

    def _left_padded(self, rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Token rows as one left-padded batch: ids (padded with ``pad_id``) and mask (1 on the tokens)."""
        ids = [torch.as_tensor(r, dtype=torch.long) for r in rows]
        pad = functools.partial(pad_sequence, batch_first=True, padding_side="left")
        return (pad(ids, padding_value=self.pad_id).to(device),
                pad([torch.ones_like(r) for r in ids], padding_value=0).to(device))

    def _prefilled(self, block: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One forward of the left-padded ``block`` after the cache: the last position's fp32 logits (rows, V)."""
        width = block.shape[1]
        out = self.model(input_ids=block, attention_mask=mask, position_ids=positions(mask)[:, -width:],
                         use_cache=True, **cache_names.passed(self.cache))
        return out.logits[:, -1].float()

    def _decoded(self, logits: torch.Tensor, mask: torch.Tensor, sampling: Sampling) -> Rollout:
        """The turn decoded from ``logits`` on the cache, the rows that leave the batch set aside; ``valid`` then
        marks each row's cached tokens (its mask, its completion but the last token)."""
        self.pieces = []
        choice = decode_step(self.model, self.cache, decided(self.model, DECODE_STEP))
        eos = torch.as_tensor(self.eos, dtype=torch.long, device=mask.device)
        rollout = decode(choice.step, logits, mask, sampling, eos, self.pad_id, self.generator,
                         f"generation of {mask.shape[0]} episodes' turn", self.cache, self.stop, self._set_aside)
        aside = torch.cat([p[0] for p in self.pieces]) if self.pieces else mask.new_zeros(0)
        left = torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device)
        left[aside] = False
        self.pieces.append((left.nonzero()[:, 0], [(layer.keys, layer.values) for layer in self.cache.layers]))
        done = rollout.completion_mask.sum(-1, keepdim=True) - 1  # the completion's tokens fed to the cache
        fed = (torch.arange(rollout.completion_ids.shape[1], device=mask.device) < done).long()
        self.valid = torch.cat([mask.long(), fed], dim=1)
        return rollout

    def _set_aside(self, cache, live: torch.Tensor, finished: torch.Tensor) -> None:  # noqa: ANN001
        gone = finished.nonzero()[:, 0]
        self.pieces.append((live[gone], [(layer.keys.index_select(0, gone), layer.values.index_select(0, gone))
                                         for layer in cache.layers]))

    def _gather(self, taken: torch.Tensor, length: int, capacity: int) -> None:
        """The cache made anew for the rows ``taken`` of the last turn (in that order), ``length`` positions kept."""
        where = torch.full((self.valid.shape[0],), -1, dtype=torch.long, device=taken.device)
        slot = torch.zeros_like(where)
        for p, (rows, _) in enumerate(self.pieces):
            where[rows] = p
            slot[rows] = torch.arange(len(rows), device=taken.device)
        pieces = []
        for p, (_, layers) in enumerate(self.pieces):
            to = (where[taken] == p).nonzero()[:, 0]
            if len(to):
                pieces.append((to, slot[taken[to]], layers))
        self.pieces = []  # the rows not going on let go now; the others as they are copied
        gathered(self.cache, pieces, len(taken), length, capacity)
