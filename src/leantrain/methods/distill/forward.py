"""Distillation's rows and forwards: a micro-batch of N prompts (left-padded) and one completion each (right-padded,
``completion_ids`` / ``completion_mask``: the student's sample, the teacher's, or the data's), and each model's output
at the positions that predict the completion's tokens (``losses.Logits``: the output layer's input where the chunked
output layer is installed, else plain logits).

The rows go through the model as GRPO's concatenated rows (``methods/grpo/forward.concatenated``: each completion after
its prompt, position ids from the mask) with the output layer kept on the last C + 1 positions alone
(``logits_to_keep``): position j of those predicts completion token j."""

from __future__ import annotations

import torch

from leantrain.methods.distill.losses import Logits
from leantrain.methods.grpo.forward import (COMPLETION_IDS, COMPLETION_LABELS, COMPLETION_MASK, IGNORE, PROMPT_IDS,
                                            PROMPT_MASK, concatenated)
from leantrain.methods.parts import model_inputs
from leantrain.modeling.chunked_loss import chunked_layer, final_hidden, keeps_logits
from leantrain.modeling.generation.decode import Rollout

TEACHER_STATES = "teacher_states"  # (rows, C, H): the teacher's output-layer input at each completion position
TEACHER_LOGITS = "teacher_logits"  # (rows, C, V): its logits, where its output layer cannot be captured
ON_POLICY = "on_policy"  # (rows,) 1 where the completion is the student's own sample


def training_rows(batch: dict, completions: Rollout | None, max_new_tokens: int, pad_id: int,
                  on_policy: bool) -> dict:
    """The training micro-batch of a loaded prompt micro-batch: its prompts and the ``completions`` (a rollout of one
    per prompt), or the data's (``completions`` None), cut at ``max_new_tokens`` and at the longest."""
    if completions is not None:
        ids, mask = completions.completion_ids, completions.completion_mask.long()
    else:
        ids, mask = batch[COMPLETION_IDS], batch[COMPLETION_MASK].long()
    ids, mask = ids[:, :max_new_tokens], mask[:, :max_new_tokens]
    width = max(1, int(mask.sum(-1).max())) if mask.numel() else 1
    ids, mask = ids[:, :width].masked_fill(mask[:, :width] == 0, pad_id), mask[:, :width]
    device = batch[PROMPT_IDS].device
    weights = batch["loss_weight"]
    return {PROMPT_IDS: batch[PROMPT_IDS], PROMPT_MASK: batch[PROMPT_MASK], COMPLETION_IDS: ids.to(device),
            COMPLETION_MASK: mask.to(device), COMPLETION_LABELS: ids.masked_fill(mask == 0, IGNORE).to(device),
            "loss_weight": weights, ON_POLICY: torch.full_like(weights, float(on_policy))}


def selected(batch: dict) -> torch.Tensor:
    """(rows, C) float: 1 on the completion tokens the loss covers (not padding, rows of weight > 0), 0 elsewhere (the
    divergence is computed at every position and weighed, not selected: no shape that depends on the data, no host
    read)."""
    return ((batch[COMPLETION_MASK] != 0) & (batch["loss_weight"] != 0).unsqueeze(1)).float()


def completion_outputs(model, batch: dict) -> tuple[torch.Tensor | None, torch.Tensor | None, object]:  # noqa: ANN001
    """(states ``(rows, C, H)`` or None, logits ``(rows, C, V)`` or None, the output layer or None) of ``model`` at
    the positions predicting each completion token: the chunked output layer's input when it is installed (no
    logits), else the plain logits."""
    inputs = concatenated(batch)
    inputs.pop("labels")
    width = batch[COMPLETION_IDS].shape[1]
    if keeps_logits(model):
        inputs["logits_to_keep"] = width + 1
    layer = chunked_layer(model)
    if layer is not None:
        hidden = final_hidden(model, lambda: model(**model_inputs(inputs)))
        return hidden.states[:, -(width + 1):-1], None, (layer, hidden.dtype)
    return None, model(**model_inputs(inputs)).logits[:, -(width + 1):-1], None


def as_logits(states: torch.Tensor | None, logits: torch.Tensor | None, layer) -> Logits:  # noqa: ANN001
    """``completion_outputs`` as ``losses.Logits`` rows, one per completion position (``rows * C``)."""
    if states is None:
        return Logits(logits=logits.reshape(-1, logits.shape[-1]))
    module, dtype = layer
    return Logits(states=states.reshape(-1, states.shape[-1]), weight=module.weight, bias=getattr(module, "bias", None),
                  dtype=dtype)
