"""``datasets.map`` with a tokenizer among the function's arguments, fingerprinted without pickling the tokenizer.

``Dataset.map`` names its result (and its cache file) by a fingerprint of the transform: the dataset's fingerprint,
the function, its keyword arguments and the map's own. datasets hashes a tokenizer argument by pickling the whole
object (0.3 s for a 30k-word vocabulary, seconds for a large one, at every map: a training run maps its train and eval
data). ``tokenizer_map`` gives the same fingerprint's ingredients to datasets' own ``Hasher``, each tokenizer replaced
by what decides its output (``tokenizer_identity``): its class, its fast backend's full definition (normaliser,
pre-tokeniser, vocabulary, merges, post-processor, added tokens; not the truncation and padding the last call left
set), its init arguments, special tokens, sides, length and chat template. A slow tokenizer (no backend to read) is
left to datasets' pickle.
"""

from __future__ import annotations

import json
import marshal


def tokenizer_identity(tokenizer) -> str | None:  # noqa: ANN001 - a transformers tokenizer
    """A hash of what decides ``tokenizer``'s output; None for a tokenizer without a fast backend."""
    from datasets.fingerprint import Hasher

    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is None:
        return None
    settings = {"init_kwargs": getattr(tokenizer, "init_kwargs", {}), "special": tokenizer.special_tokens_map,
                "padding_side": tokenizer.padding_side, "truncation_side": tokenizer.truncation_side,
                "model_max_length": tokenizer.model_max_length,
                "chat_template": getattr(tokenizer, "chat_template", None)}
    definition = json.loads(backend.to_str())
    for state in ("truncation", "padding"):  # what the last call set (each call sets its own): not an identity
        definition.pop(state, None)
    return Hasher.hash([type(tokenizer).__module__, type(tokenizer).__qualname__,
                        json.dumps([definition, settings], sort_keys=True, default=str)])


def function_identity(function) -> tuple:  # noqa: ANN001 - a function
    """A module-level function by its module, name and compiled code (the same bytes for the same source; a dill
    pickle of a function can differ from one call to the next in one process)."""
    code = getattr(function, "__code__", None)
    return function.__module__, function.__qualname__, marshal.dumps(code) if code is not None else repr(function)


def tokenizer_map(dataset, function, fn_kwargs: dict, **map_args):  # noqa: ANN001, ANN201 - datasets.Dataset
    """``dataset.map(function, fn_kwargs=fn_kwargs, **map_args)``, its fingerprint computed with each tokenizer of
    ``fn_kwargs`` by its identity (module docstring); as datasets computes it when a tokenizer has none."""
    from datasets.fingerprint import Hasher
    from transformers import PreTrainedTokenizerBase

    tokenizers = {k: tokenizer_identity(v) for k, v in fn_kwargs.items() if isinstance(v, PreTrainedTokenizerBase)}
    if None in tokenizers.values():  # a slow tokenizer: datasets pickles it
        return dataset.map(function, fn_kwargs=fn_kwargs, **map_args)
    hashed = {k: ("tokenizer", tokenizers[k]) if k in tokenizers else v for k, v in fn_kwargs.items()}
    settings = {k: v for k, v in map_args.items() if k != "desc"}  # the progress bar's text does not change the rows
    fingerprint = Hasher.hash([dataset._fingerprint, "leantrain.tokenizer_map", function_identity(function), hashed,
                               settings])
    return dataset.map(function, fn_kwargs=fn_kwargs, new_fingerprint=fingerprint, **map_args)
