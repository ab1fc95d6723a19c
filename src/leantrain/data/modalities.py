"""One data side per modality (text, image, audio; tagged: words with a tag each, token classification; tokens:
causal-LM text and instruction data; pairs, feedback, scored-pairs: preference data, ``data/lm/preference.py``;
prompts: GRPO's prompts to be answered, ``data/lm/prompts.py``): load + validate, process with the model's processor,
collate.
The engine picks one through the task's modality (``leantrain.methods``: ``Task.spec.modality``, and
``Task.data.side`` may adapt it) and stays free of task and modality branches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from leantrain.config import DataConfig
from leantrain.data import audio, image, tagged, text_loader
from leantrain.data.lm import corpus, preference, prompts
from leantrain.data.lm.sft import with_instructions
from leantrain.data.loaders import make_collator
from leantrain.data.text import pad_multiple, tokenize


@dataclass(frozen=True)
class Modality:
    name: str
    load_and_validate: Callable  # (DataConfig, *, seed, batch_size, known_labels=None) -> PreparedData
    load_rows: Callable  # (path, DataConfig, *, require_labels, known_labels) -> (Dataset, notes)
    process: Callable  # (canonical Dataset, processor, DataConfig, desc) -> Dataset with [labels], length
    collator: Callable  # (processor, DataConfig, *, train, seed, device_type) -> rows -> tensors
    counts_tokens: bool  # `length` counts tokens (tokens/s is reported for text only)
    label_kind: Callable = lambda cfg: "classes"  # (DataConfig) -> "classes" | "scores" | "label_sets" | "tags" |
    # "none" | "pairs" | "feedback" | "prompts": what auto reads
    describe: Callable = lambda train, evals, labels: (  # the run's one line about its processed data
        f"{len(train)} train / {len(evals)} eval rows, {len(labels)} label{'s' * (len(labels) != 1)} {labels[:10]}")
    detected: Callable = lambda rows: {}  # (rows from load_rows) -> what Task.data.check reads of them (eval's format)


def _sequences_and_tokens(train, evals, labels) -> str:
    """A language model's data: sequences (blocks, or examples unpacked) and the tokens in them; no labels."""
    def tokens(ds) -> int:
        return int(np.asarray(ds["length"], dtype=np.int64).sum()) if len(ds) else 0

    return f"{len(train)} train / {len(evals)} eval sequences, {tokens(train):,} / {tokens(evals):,} tokens"


def _text_process(dataset, tokenizer, cfg: DataConfig, desc: str = "Tokenizing"):
    return tokenize(dataset, tokenizer, cfg.max_length, desc=desc)


def _text_collator(tokenizer, cfg: DataConfig, *, train: bool, seed: int = 0, device_type: str = "cpu"):
    return make_collator(tokenizer, batching=cfg.batching, max_length=cfg.max_length,
                         pad_multiple=pad_multiple(device_type))


MODALITIES = {
    "text": Modality("text", text_loader.load_and_validate, text_loader.load_rows, _text_process, _text_collator, True,
                     text_loader.label_kind),
    **{m.KIND.role: Modality(m.KIND.role, m.load_and_validate, m.load_rows, m.process, m.collator, False)
       for m in (image, audio)},
    "tagged": Modality("tagged", tagged.load_and_validate, tagged.load_rows, tagged.process,
                       tagged.collator, True, lambda cfg: "tags"),
    "tokens": with_instructions(  # instruction/chat data (data/lm/sft.py) or plain text (data/lm/corpus.py), by its columns
        Modality("tokens", corpus.load_and_validate, corpus.load_rows, corpus.process, corpus.collator, True,
                 corpus.label_kind, _sequences_and_tokens)),
    **{side: Modality(side, **preference.side_functions(side))  # preference data (data/lm/preference.py)
       for side in preference.SIDES},
}


def either_side(pairs: Modality, feedback: Modality) -> Modality:
    """Preference tuning's data side: chosen / rejected ``pairs`` (DPO and its variants), or unpaired ``feedback``
    (KTO), chosen by the data's format per call (``preference.is_feedback``)."""

    def pick(data, cfg: DataConfig | None = None) -> Modality:  # noqa: ANN001 - a DataConfig, a path or a dataset
        return feedback if preference.is_feedback(data, cfg) else pairs

    def collator(tokenizer, cfg: DataConfig, **kw):  # noqa: ANN001, ANN202 - by the rows: feedback has desirable
        both = pairs.collator(tokenizer, cfg, **kw), feedback.collator(tokenizer, cfg, **kw)
        return lambda rows: both["desirable" in rows[0]](rows)

    return Modality(
        "pairs-or-feedback", lambda cfg, **kw: pick(cfg).load_and_validate(cfg, **kw),
        lambda path, cfg, **kw: pick(path, cfg).load_rows(path, cfg, **kw),
        lambda ds, tokenizer, cfg, **kw: pick(ds).process(ds, tokenizer, cfg, **kw), collator, True,
        lambda cfg: "pairs", detected=lambda rows: pick(rows).detected(rows))


MODALITIES["pairs-or-feedback"] = either_side(MODALITIES["pairs"], MODALITIES["feedback"])
MODALITIES["prompts"] = Modality(  # prompts to be answered and scored (GRPO: data/lm/prompts.py)
    "prompts", prompts.load_and_validate, prompts.load_rows, prompts.process, prompts.collator, True,
    lambda cfg: "prompts", prompts.describe, prompts.detected)


def for_modality(name: str) -> Modality:
    """The data side of a modality: ``text``, ``image``, ``audio``, ``tagged``, ``tokens`` (causal LMs), ``pairs``,
    ``feedback`` or ``scored-pairs`` (preference data), ``prompts`` (GRPO)."""
    try:
        return MODALITIES[name]
    except KeyError:
        raise ValueError(f"unknown modality {name!r}") from None
