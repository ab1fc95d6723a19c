"""The ``tokens`` data side (causal language models): sources checked before any model, tokenised once into
cached token shards (``token_shards``, prepared by ``shard_writer`` into ``shard_cache``), cut into fixed blocks
(``blocks``), collated by ``collate``.

``load_and_validate`` resolves and checks the sources (files exist, the text column is there) without a
tokenizer; ``process`` (with the run's tokenizer) prepares or reuses the shards and returns ``Blocks``. With no
``data.eval``, the eval data is a seeded hold-out of blocks (``data.eval_fraction``), the same in both calls.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from leantrain.config import DataConfig
from leantrain.data.lm.blocks import Blocks
from leantrain.data.caches import using_cache_dir
from leantrain.data.lm.collate import LMCollator, pad_id_of
from leantrain.data.sources import SourceError
from leantrain.data.text import pad_multiple
from leantrain.data.text_loader import PreparedData, data_error
from leantrain.data.lm.shard_cache import prepared_shards
from leantrain.data.lm.token_sources import TokenSource, open_token_source
from leantrain.errors import DataError

log = logging.getLogger("leantrain")


@dataclass
class LMSplit:
    """One split before tokenising: its source, and which blocks of it (all, or the train/eval side of a
    seeded hold-out), and a first-N cut."""

    source: TokenSource
    part: str = "all"  # all | train | eval (of a hold-out)
    fraction: float = 0.1
    seed: int = 0
    first: int | None = None
    first_key: str = ""


def load_and_validate(cfg: DataConfig, *, seed: int, batch_size: int, known_labels: list[str] | None = None
                      ) -> PreparedData:
    """The train and eval sources of ``cfg``, checked (no tokenizer needed); one DataError for all problems."""
    if cfg.train is None:
        raise data_error(["data.train: a causal LM needs training text (.txt files, a tabular/JSON file with "
                          "data.text_column, or a folder from leantrain prepare)"])
    problems, sources = [], {}
    for key, spec in (("data.train", cfg.train), ("data.eval", cfg.eval)):
        if spec is None:
            continue
        try:
            sources[key] = open_token_source(spec, key, text_column=cfg.text_column, separator=cfg.document_separator,
                                             split=cfg.eval_split if key == "data.eval" else cfg.train_split,
                                             quoting=cfg.quoting, eval_split=key == "data.eval")
        except SourceError as e:
            if not (problems and "data.text_column" in str(e)):  # a broken train source may be instruction data
                problems.append(str(e))  # (undetectable): the eval source's column is no problem of its own then
    if problems:
        raise data_error(problems)
    notes: list[str] = []
    for src in sources.values():
        if src.skipped:
            notes.append(f"{src.where}: reading its {len(src.files)} .txt file(s); skipped (a folder is read for "
                         f".txt files, not subfolders): {', '.join(src.skipped[:10])}"
                         + (f" and {len(src.skipped) - 10} more" if len(src.skipped) > 10 else ""))
    train_src = sources["data.train"]
    if "data.eval" in sources:
        train, evaluation = LMSplit(train_src), LMSplit(sources["data.eval"])
    else:
        train = LMSplit(train_src, "train", cfg.eval_fraction, seed)
        evaluation = LMSplit(train_src, "eval", cfg.eval_fraction, seed)
        notes.append(f"eval data: none given, so {cfg.eval_fraction:.0%} of the training blocks are held out (seed "
                     f"{seed}; set data.eval to use your own)")
    train.first, train.first_key = cfg.max_train_samples, "data.max_train_samples"
    evaluation.first, evaluation.first_key = cfg.max_eval_samples, "data.max_eval_samples"
    columns = {"text": train_src.text_column}
    return PreparedData(train, evaluation, [], columns, notes, [])


def load_rows(path: str, cfg: DataConfig, *, require_labels: bool = False, known_labels: list[str] | None = None,
              labels: str = "none") -> tuple[LMSplit, list[str]]:
    """One source for ``leantrain eval``: all its blocks."""
    try:
        source = open_token_source(path, "data.eval", text_column=cfg.text_column, separator=cfg.document_separator,
                                   split=cfg.eval_split, quoting=cfg.quoting, eval_split=True)
    except SourceError as e:
        raise data_error([str(e)]) from None
    return LMSplit(source, first=cfg.max_eval_samples, first_key="data.max_eval_samples"), []


def process(split: LMSplit, tokenizer, cfg: DataConfig, desc: str = "Tokenizing") -> Blocks:  # noqa: ANN001
    """Token shards of the split's source (prepared, or reused from the cache), cut into blocks."""
    try:
        with using_cache_dir(cfg.cache_dir):
            shards = prepared_shards(split.source, tokenizer, num_proc=cfg.num_proc, desc=desc)
    except SourceError as e:
        raise data_error([str(e)]) from None
    blocks = Blocks(shards, cfg.block_size, document_mask=cfg.document_mask)
    where = split.source.where
    need = 2 if split.part != "all" else 1
    if len(blocks) < need:
        raise data_error([f"{where}: {shards.n_tokens:,} tokens make {len(blocks)} block(s) of data.block_size="
                          f"{cfg.block_size}; {'a hold-out needs 2' if need == 2 else 'at least 1 is needed'} (lower "
                          "data.block_size or give more text)"])
    if split.part != "eval":
        log.info("%s: %s tokens in %s documents -> %s blocks of %d tokens%s", where, f"{shards.n_tokens:,}",
                 f"{shards.n_documents:,}", f"{len(blocks):,}", cfg.block_size,
                 f"; the last {blocks.tail_tokens:,} tokens (short of a block) are dropped" if blocks.tail_tokens else "")
    if split.part in ("train", "eval"):
        train, evaluation = blocks.hold_out(split.fraction, split.seed)
        blocks = train if split.part == "train" else evaluation
        if split.part == "eval":
            log.info("eval data: %d of %d blocks held out (seed %d)", len(evaluation), len(train) + len(evaluation),
                     split.seed)
    if split.first is not None and len(blocks) > split.first:
        log.info("%s: using the first %d of %d blocks", split.first_key, split.first, len(blocks))
        blocks = blocks.select(range(split.first))
    return blocks


def collator(tokenizer, cfg: DataConfig, *, train: bool, seed: int = 0, device_type: str = "cpu") -> LMCollator:  # noqa: ANN001
    return LMCollator(pad_id_of(tokenizer), multiple_of=pad_multiple(device_type))


def label_kind(cfg: DataConfig) -> str:
    return "none"


__all__ = ["LMSplit", "load_and_validate", "load_rows", "process", "collator", "label_kind", "DataError"]
