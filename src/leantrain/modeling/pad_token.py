"""Padding for decoder models (GPT-2, Llama, ...) in classification.

Their tokenizers often have no pad token and their configs no ``pad_token_id``; a batch of several examples then
cannot be padded, and ``*ForSequenceClassification`` cannot find each row's last token ("Cannot handle batch sizes
> 1 if no padding token is defined"). leantrain gives the tokenizer its EOS token as pad token where it has none,
and the model config the tokenizer's pad token id, and says so. The classifier reads the last non-pad token, and
the attention mask hides the padding, so EOS as pad changes nothing else.
"""

from __future__ import annotations

import logging

from leantrain.errors import UserError

log = logging.getLogger("leantrain")


def ensure_pad_token(tokenizer, name: str = "", *, say: bool = True) -> None:
    """Give a tokenizer without a pad token its EOS token as pad token (in place); ``say``: log it."""
    if getattr(tokenizer, "pad_token", None) is not None or not hasattr(tokenizer, "pad_token"):
        return
    eos = getattr(tokenizer, "eos_token", None)
    if eos is None:
        raise UserError(f"the tokenizer of {name or 'the model'} has neither a pad token nor an EOS token, so batches "
                        "cannot be padded; use a tokenizer that has one (model.name)")
    tokenizer.pad_token = eos
    if say:
        log.info("padding: the tokenizer has no pad token; using its EOS token %r (id %d)", eos,
                 tokenizer.pad_token_id)


def set_model_pad_token(model, tokenizer) -> None:
    """Set ``model.config.pad_token_id`` from the tokenizer where the config has none."""
    if getattr(model.config, "pad_token_id", None) is not None:
        return
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        return
    model.config.pad_token_id = pad_id
    log.info("padding: model.config.pad_token_id = %d (the tokenizer's pad token)", pad_id)
