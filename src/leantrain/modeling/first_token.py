"""A BERT sequence classifier's last layer for the first token only.

``BertForSequenceClassification`` classifies from its pooler, which reads the last layer's output at the first token
([CLS]) and nothing else. So in the last layer only that token's query, attention row, output projection and
feed-forward reach the logits; the other positions' keys and values are still needed (the first token attends to
them), their queries, attention rows, output projections and feed-forwards are not. :func:`first_token_last_layer`
computes exactly that: the same weights, the same attention function (SDPA or eager), the same mask row, so the
logits, the loss and every gradient are the plain model's up to float rounding (tests/unit/modeling/
test_first_token.py). On MiniLM (6 layers, 256-token pairs) this is about 83% of the last layer's matmul work, a
seventh of the model's. The model is unchanged outside the ``with`` (its weights, its saved form, what ``pipeline()``
computes); only the hidden states the model returns are cut to the first token inside it.
"""

from __future__ import annotations

import types
from contextlib import contextmanager

import torch
from torch import nn

from leantrain.modeling.fast_paths import FIRST_TOKEN, or_probe
from leantrain.modeling.short_attention import NAME as SHORT_SDPA

ATTENTION = ("sdpa", "eager", SHORT_SDPA)  # the attention functions whose query may be shorter than its keys


def refusal(model: nn.Module) -> str | None:
    """Why the first-token last layer does not apply to ``model`` (None: it does): it is no BERT sequence classifier
    whose logits read only the first token (the pooler), or its attention function cannot take a query shorter than
    its keys. The engine's connector asks it once (``modeling/fast_paths.py``)."""
    config, bert = getattr(model, "config", None), getattr(model, "bert", None)
    if type(model).__name__ != "BertForSequenceClassification" or bert is None:
        return f"{type(model).__name__} is not a BERT sequence classifier"
    if bert.pooler is None or config.is_decoder:
        return "its logits do not read the first token alone (no pooler, or a decoder)"
    if getattr(config, "_attn_implementation", None) not in ATTENTION:
        return f"its attention ({config._attn_implementation}) takes no query shorter than its keys"
    layer = bert.encoder.layer[-1]
    has_parts = all(hasattr(layer, p) for p in ("attention", "intermediate", "output", "feed_forward_chunk"))
    return None if has_parts and hasattr(layer.attention, "self") else "its last layer is not BERT's layout"


def last_layer(model: nn.Module) -> nn.Module | None:
    """The last encoder layer of a BERT sequence classifier whose logits read only the first token (the pooler);
    None for any other model, attention function or layout (:func:`refusal` says why)."""
    return model.bert.encoder.layer[-1] if refusal(model) is None else None


def _first_token_forward(layer: nn.Module, hidden_states: torch.Tensor, attention_mask=None, *args, **kwargs):
    """``BertLayer.forward`` for the first position: keys and values of every position, the rest of it for the
    first one. Returns (B, 1, H)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # lazy: transformers' import is slow
    from transformers.models.bert.modeling_bert import eager_attention_forward  # lazy: as above

    attn = layer.attention.self
    b, t = hidden_states.shape[:2]
    first = hidden_states[:, :1]

    def heads(x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(b, n, -1, attn.attention_head_size).transpose(1, 2)

    query = heads(attn.query(first), 1)
    key, value = heads(attn.key(hidden_states), t), heads(attn.value(hidden_states), t)
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[2] > 1:
        attention_mask = attention_mask[:, :, :1]  # the first query's row
    function = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, eager_attention_forward)
    out, _ = function(attn, query, key, value, attention_mask, dropout=attn.dropout.p if attn.training else 0.0,
                      scaling=attn.scaling)
    out = layer.attention.output(out.reshape(b, 1, -1).contiguous(), first)
    return layer.feed_forward_chunk(out)


@contextmanager
def first_token_last_layer(model: nn.Module):
    """Within the ``with``, ``model``'s last layer computes its first position only (see the module docstring)
    where the run chose it (``fast_paths.FIRST_TOKEN``, decided by the engine's connector; a model no command set
    up: where :func:`refusal` finds nothing against it); otherwise the model runs as it is."""
    chosen = or_probe(model, FIRST_TOKEN, lambda m: refusal(m) is None)
    layer = last_layer(model) if chosen else None
    if layer is None:
        yield
        return
    layer.forward = types.MethodType(_first_token_forward, layer)
    try:
        yield
    finally:
        del layer.forward  # the class's forward again
