"""The forward of a GRPO training micro-batch: the per-token log-probs of its completions (and their entropy), with
each prompt encoded once for its G completions where the model allows it.

A training micro-batch holds N left-padded prompts and their N*G right-padded completions (``rollout``). Two
ways to the same numbers (tested equal, ``tests/unit/methods/test_grpo_forward.py``):

- **shared prompts** (``shares_prompts``: as the run's record of fast paths chose it): one forward of the N prompts
  but their last token with the KV cache and no output layer, the cache repeated G times
  (``Cache.batch_repeat_interleave``, differentiable: the completions' gradients flow back into the prompt's keys and
  values), then one forward of each prompt's last token and its completion on that cache, the output layer run once
  on those positions. The prompt tokens go through the model
  once instead of G times: with 36-token prompts, 16-token completions and G = 8 the forward and backward see 652
  tokens instead of 1,664, and keep that many positions' activations; the output layer (a 49k x 576 weight for
  SmolLM2) runs in one forward and one backward, not two (its weight cast, gradient and accumulation once).
- **concatenated rows**: each completion after its (left-padded) prompt, N*G rows, position ids from the mask; the
  output layer on the completion positions alone (``logits_to_keep``). Taken when the forward cannot carry a cache
  through its backward: gradient checkpointing (transformers drops the cache under it; a recompute would append to
  it twice), a wrapper other than DDP (FSDP, DeepSpeed, compile), a model without ``logits_to_keep``.

Either way the values are ``(rows, C)``: position j is completion token j, predicted from the prompt's last position
(j = 0) or from completion token j - 1.
"""

from __future__ import annotations

import torch
from torch import nn

from leantrain.modeling.chunked_loss import IGNORE, is_installed
from leantrain.modeling.fast_paths import SHARED_PROMPTS, checkpointed, or_probe, prompt_cache_refusal
from leantrain.modeling.token_losses import token_losses
from leantrain.modeling.generation import cache_names
from leantrain.modeling.generation.decode import positions

PROMPT_IDS, PROMPT_MASK = "prompt_input_ids", "prompt_attention_mask"
COMPLETION_IDS, COMPLETION_MASK, COMPLETION_LABELS = "completion_ids", "completion_mask", "completion_labels"


def shares_prompts(model: nn.Module) -> bool:
    """Whether ``model``'s forward encodes the prompts once and carries the cache through the backward (module
    docstring): as the run chose (``fast_paths.SHARED_PROMPTS``, decided once by the engine's connector from
    ``fast_paths.prompt_cache_refusal`` and the strategy; a model no command set up: as that probe says), and never
    while gradient checkpointing is on (the memory planner's calibration passes switch it on and off)."""
    return bool(or_probe(model, SHARED_PROMPTS, lambda m: prompt_cache_refusal(m) is None)) and not checkpointed(model)


def group_size(batch: dict) -> int:
    return batch[COMPLETION_IDS].shape[0] // max(1, batch[PROMPT_IDS].shape[0])


def concatenated(batch: dict) -> dict:
    """The micro-batch as N*G rows of prompt then completion (a causal LM's batch: ``input_ids``, ``attention_mask``,
    ``position_ids``, unshifted ``labels`` with -100 on the prompts)."""
    g = group_size(batch)
    prompt_ids, prompt_mask = (batch[k].repeat_interleave(g, dim=0) for k in (PROMPT_IDS, PROMPT_MASK))
    mask = torch.cat([prompt_mask.long(), batch[COMPLETION_MASK].long()], dim=1)
    return {"input_ids": torch.cat([prompt_ids, batch[COMPLETION_IDS]], dim=1), "attention_mask": mask,
            "position_ids": positions(mask),
            "labels": torch.cat([torch.full_like(prompt_ids, IGNORE), batch[COMPLETION_LABELS]], dim=1)}


def completion_losses(task, model: nn.Module, batch: dict, entropy: bool = False):
    """(per-token losses ``(rows, C)`` = minus the completion tokens' log-probs, 0 on the masked ones; entropy
    ``(rows, C)`` or None): shared prompts when ``shares_prompts``, else the concatenated rows through ``task``'s
    ``forward_token_losses`` (a ``CausalLM``)."""
    if shares_prompts(model):
        return shared(model, batch, entropy)
    width = batch[COMPLETION_IDS].shape[1]
    return task.forward_token_losses(model, concatenated(batch), keep=width, entropy=entropy)


def shared(model: nn.Module, batch: dict, entropy: bool):
    """The prompts but their last token encoded once, their cache repeated for the G completions, then one forward of
    each prompt's last token and its completion on that cache: position 0 (the prompt's last token) predicts
    completion token 0, position j completion token j. The output layer runs on the completion forward's positions
    alone (the prompt forward keeps no logits: an empty ``logits_to_keep``), its per-token losses through
    ``token_losses`` (the installed output loss, else the logits). The prompts are left-padded, so their last column
    is each real prompt's last token."""
    g, prompt_mask, labels = group_size(batch), batch[PROMPT_MASK].long(), batch[COMPLETION_LABELS]
    head, head_mask = batch[PROMPT_IDS][:, :-1], prompt_mask[:, :-1]
    cache = None
    if head.shape[1]:
        none = torch.zeros(0, dtype=torch.long, device=head.device)  # no output layer on the prompts
        cache = cache_names.returned(model(input_ids=head, attention_mask=head_mask, position_ids=positions(head_mask),
                                           use_cache=True, logits_to_keep=none))
        cache.batch_repeat_interleave(g)
    # The completion's last token predicts nothing: left out, but by the installed output loss, which has always
    # taken it (the same numbers to rounding: kept so that runs stay bitwise what they were)
    whole = is_installed(model)
    keep = labels.shape[1] if whole else labels.shape[1] - 1
    last = batch[PROMPT_IDS][:, -1:].repeat_interleave(g, dim=0)
    ids = torch.cat([last, batch[COMPLETION_IDS][:, :keep]], dim=1)
    mask = torch.cat([prompt_mask.repeat_interleave(g, dim=0), batch[COMPLETION_MASK][:, :keep].long()], dim=1)
    start = head_mask.sum(-1, keepdim=True).repeat_interleave(g, dim=0)
    inputs = {"input_ids": ids, "attention_mask": mask, "use_cache": True, **cache_names.passed(cache),
              "position_ids": start + torch.arange(ids.shape[1], device=ids.device)}
    if whole:  # position j predicts token j + 1 of [the prompt's last token, the completion]
        labels = torch.cat([torch.full_like(last, IGNORE), labels], dim=1)
    return token_losses(model, lambda: model(**inputs), labels, next_token=whole, entropy=entropy)
