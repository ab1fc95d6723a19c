"""Continuations of prompts by a causal LM, through the generation engine (``decode.generate``): what
``leantrain generate`` prints and ``report.sample_prompts`` logs.

``continuations(model, tokenizer, prompts, max_new_tokens=...)`` returns only the new text of each prompt:

- greedy by default (``temperature=0``): the argmax token each time, the tokens transformers' ``generate`` gives
  with ``do_sample=False`` (``tests/unit/modeling/test_generation_engine.py``); ``temperature > 0`` samples
  (temperature, then ``top_p``) from a generator of its own seeded with ``seed`` (None: a fresh seed), so the same
  seed gives the same text and the caller's random state (a training run's) is never read or moved;
- each prompt as ``prompts.prompt_texts`` renders it (the chat template when the tokenizer has one and ``chat`` is
  not False, a ``system`` turn, ``tools``);
- prompts run in batches of ``batch_size``, padded on the left (the new tokens of every row start at the same
  position) with the pad token (else the EOS token); the tokenizer is not changed;
- a row ends at its first EOS: the tokenizer's or any of the model's generation config (``decode.stop_ids``);
- the model is put in eval mode for the call and back in train mode after when it was training;
- a long generation reports its positions and new tokens to the open ``heartbeat`` sink (``leantrain generate``,
  sample prompts).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from leantrain.errors import UserError
from leantrain.modeling.generation.decode import generate, pad_id, stop_ids
from leantrain.modeling.generation.prompts import check_settings, prompt_texts
from leantrain.modeling.generation.sampling import Sampling, seeded
from leantrain.modeling.wrappers import unwrapped


def continuations(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int, chat: bool | None = None,
                  system: str | None = None, tools: list[dict] | None = None, temperature: float = 0.0,
                  top_p: float = 1.0, seed: int | None = None, batch_size: int = 16) -> list[str]:
    """The new text the model writes after each prompt (see the module docstring), in the prompts' order."""
    check_settings(max_new_tokens, temperature, top_p, seed)
    texts, templated = prompt_texts(tokenizer, prompts, chat, system, tools)
    model = unwrapped(model)  # DDP, compile: the model inside (the same weights)
    device = next(model.parameters()).device
    sampling = Sampling(max_new_tokens, temperature=temperature, top_p=top_p)
    generator = seeded(device, seed) if temperature > 0 else None
    eos, pad = stop_ids(model, tokenizer), pad_id(tokenizer)
    out: list[str] = []
    for start in range(0, len(texts), batch_size):
        batch = texts[start:start + batch_size]
        ids, mask = left_padded(tokenizer, batch, templated, pad, device)
        rollout = generate(model, ids, mask, num_generations=1, sampling=sampling, eos_ids=eos, pad_id=pad,
                           generator=generator,
                           what=f"generation of prompts {start + 1}-{start + len(batch)} of {len(texts)}")
        out += new_texts(tokenizer, rollout.completion_ids, rollout.completion_mask)
    return out


def left_padded(tokenizer, texts: Sequence[str], templated: bool, pad: int, device: torch.device):
    """The token ids (B, P) of ``texts`` padded on the left with ``pad``, and their attention mask (B, P). A template
    writes its own special tokens (BOS); plain prompts get the tokenizer's."""
    rows = tokenizer(list(texts), add_special_tokens=not templated)["input_ids"]
    width = max(len(r) for r in rows)
    if width == 0:
        raise UserError("the prompts have no tokens: give each prompt some text")
    ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids.to(device), mask.to(device)


def new_texts(tokenizer, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Each row's generated tokens up to its EOS, as text without the special tokens."""
    return tokenizer.batch_decode([row[:n] for row, n in zip(ids.tolist(), mask.sum(-1).tolist())],
                                  skip_special_tokens=True)
