"""The data side of token classification: rows of words with one tag per word, validated, tokenised with word
alignment, batched with per-token labels.

Load (``load_and_validate`` / ``load_rows``): JSON / JSONL / Parquet rows or a CoNLL column file
(``leantrain.data.conll``), every row checked in one pass (words and tags of different lengths, a missing list, a
tag the training data or the model lacks, integer tags without ``data.label_names``), all problems raised together
as one DataError naming file and line. The canonical rows are ``tokens`` (list of words) and ``label`` (list of
tag ids).

Process (``process``): the fast tokenizer with ``is_split_into_words=True``; each row keeps its ``word_ids`` (-1 for
special tokens), its ``tags`` and how many sub-tokens carry a label (``n_first``: the first of each word, ``n_all``:
every one), the loss's units. Words cut off by ``data.max_length`` are counted and reported, never silently lost.

Collate (``TokenCollator``): the text collator's padded inputs, plus ``labels`` per sub-token: the word's tag on
its first sub-token (``data.label_all_tokens=true``: on all, training only), -100 elsewhere.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import torch

from leantrain.config import DataConfig
from leantrain.data.caches import using_cache_dir
from leantrain.data.conll import is_conll_path, read_conll, tags_column, tokens_column
from leantrain.data.labels import capped, listing
from leantrain.data.mapped import tokenizer_map
from leantrain.data.sources import Part, SourceError, open_source, pick_split
from leantrain.data.text import MODEL_INPUTS, TextCollator, pad_multiple
from leantrain.data.text_loader import PreparedData, data_error, open_rows, prepared, source_warnings
from leantrain.errors import UserError

log = logging.getLogger("leantrain")

IGNORE = -100  # the label of sub-tokens the loss and the metrics skip (torch's cross_entropy ignore_index)


@dataclass
class TagMap:
    """Tag names in id order (``names``) and how the data's tags map to them (``ids``: name -> id; None when the
    data's integer tags are the ids)."""

    names: list[str]
    ids: dict[str, int] | None


# ----------------------------------------------------------------------------------------------- loading


def open_any(spec: str, key: str | None, cfg: DataConfig):
    """A CoNLL column file (``.conll``, ``.txt``, no extension) or anything ``open_source`` reads."""
    if is_conll_path(spec):
        return read_conll(Path(spec).expanduser(), key)
    return open_source(spec, key, quoting=cfg.quoting)


def _parts(cfg: DataConfig) -> tuple[Part, Part | None]:
    if cfg.train is None:
        raise data_error(["data.train is not set: token classification needs rows of words and tags (JSONL with "
                          "tokens / ner_tags, or a CoNLL file)"])
    problems, sources = [], {}
    for key, spec in (("data.train", cfg.train), ("data.eval", cfg.eval)):
        try:
            sources[key] = open_any(spec, key, cfg) if spec is not None else None
        except SourceError as e:
            problems.append(str(e))
    if problems:
        raise data_error(problems)
    try:
        train = pick_split(sources["data.train"], [cfg.train_split], setting="data.train_split", single_ok=False)
        evals = None
        wanted = [cfg.eval_split] if cfg.eval_split else ["validation", "test"]
        setting = "data.eval_split" if cfg.eval_split else None
        if sources["data.eval"] is not None:
            evals = pick_split(sources["data.eval"], wanted, setting=setting, single_ok=True)
        elif isinstance(sources["data.train"].data, datasets.DatasetDict):
            evals = pick_split(sources["data.train"], [w for w in wanted if w != cfg.train_split], setting=setting,
                               single_ok=False)
            if evals is not None:
                evals.key = "data.eval"
    except SourceError as e:
        raise data_error([str(e)]) from None
    return train, evals


def _columns(cfg: DataConfig, part: Part, notes: list[str], *, need_tags: bool) -> tuple[str | None, str | None, list]:
    ds, problems = part.ds, []
    words = tokens_column(ds, cfg.tokens_column)
    if words is None:
        why = (f"no column {cfg.tokens_column!r} (data.tokens_column)" if cfg.tokens_column else
               "no list column of words named tokens or words; set data.tokens_column")
        problems.append(f"{part.where}: {why}; columns: {', '.join(ds.column_names)}")
    elif cfg.tokens_column is None:
        notes.append(f"words column: {words!r} (auto-detected; set data.tokens_column to change)")
    tags = tags_column(ds, cfg.label_column, words)
    if tags is None and need_tags:
        why = (f"no column {cfg.label_column!r} (data.label_column)" if cfg.label_column else
               "no list column of tags named ner_tags, tags or labels; set data.label_column")
        problems.append(f"{part.where}: {why}; columns: {', '.join(ds.column_names)}")
    elif tags is not None and cfg.label_column is None:
        notes.append(f"tags column: {tags!r} (auto-detected; set data.label_column to change)")
    return words, tags, problems


def _tag_names_of(part: Part, col: str) -> list[str] | None:
    """The names of a Sequence(ClassLabel) tag column (datasets' conll2003), else None."""
    feature = part.ds.features[col]
    inner = getattr(feature, "feature", None)
    return list(inner.names) if isinstance(inner, datasets.ClassLabel) else None


def _check_rows(part: Part, words_col: str, tags_col: str | None) -> tuple[list[list[str]], list | None, list[str]]:
    """(words, tags, problems) of every row: a list of strings, a list of tags of the same length."""
    words = part.ds[words_col]
    tags = part.ds[tags_col] if tags_col is not None else None
    bad: dict[str, list[int]] = {}
    for i, w in enumerate(words):
        if not isinstance(w, list) or not w:
            bad.setdefault(f"no words (an empty or missing list in column {words_col!r})", []).append(i)
            continue
        if any(not isinstance(x, str) or not x for x in w):
            bad.setdefault(f"a word that is not a non-empty string in column {words_col!r}", []).append(i)
        if tags is None:
            continue
        t = tags[i]
        if not isinstance(t, list):
            bad.setdefault(f"no tag list in column {tags_col!r}", []).append(i)
        elif len(t) != len(w):
            bad.setdefault(f"words and tags of different lengths (columns {words_col!r} and {tags_col!r})",
                           []).append(i)
        elif any(x is None or isinstance(x, (bool, float, list, dict)) for x in t):
            bad.setdefault(f"a tag that is not a string or an integer id in column {tags_col!r}", []).append(i)
    problems = [f"{part.where}: {len(r)} row{'s' if len(r) > 1 else ''} with {what} ({part.rows(r)})"
                for what, r in bad.items()]
    return words, tags, problems


def _tag_map(cfg: DataConfig, parts: list[tuple[Part, list]], class_names: list[str] | None,
             known: list[str] | None) -> tuple[TagMap | None, list[str], list[str]]:
    """(map, notes, problems): the tag set from the model (``known``), data.label_names, the column's class names,
    or the training tags (strings: "O" first, then sorted); tags outside it are problems naming file and rows."""
    train_tags = parts[0][1]
    ints = all(isinstance(x, int) for _, tags in parts for row in tags for x in row)
    if known is not None:
        names, how = list(known), "the model's tags"
    elif cfg.label_names is not None:
        names, how = list(cfg.label_names), "data.label_names"
    elif class_names is not None:
        names, how = class_names, "the dataset's tag names"
    elif ints:
        return None, [], [f"{parts[0][0].where}: the tags are integer ids; set data.label_names to their names (in id "
                          "order, e.g. [O, B-PER, I-PER, ...]): entity metrics and predictions need the tag names"]
    else:
        seen = sorted({x for row in train_tags for x in row})
        names = (["O"] if "O" in seen else []) + [n for n in seen if n != "O"]
        how = "the training data's tags, O first, then sorted"
    index = {n: i for i, n in enumerate(names)}
    problems = []
    for part, tags in parts:
        unknown: dict[str, list[int]] = {}
        for i, row in enumerate(tags):
            for x in row:
                ok = (0 <= x < len(names)) if isinstance(x, int) and (ints or class_names is not None) else str(x) in index
                if not ok:
                    unknown.setdefault(str(x), []).append(i)
        src = "the model" if known is not None else ("data.label_names" if cfg.label_names is not None else
                                                     "the training data")
        problems += [f"{part.where}: tag {name!r} is not among the tags of {src} ({capped(names)}) — "
                     f"{len(rows)} row{'s' if len(rows) > 1 else ''} ({part.rows(sorted(set(rows)))})"
                     for name, rows in list(unknown.items())[:5]]
    ids = None if ints or class_names is not None else index
    note = f"labels: {len(names)} tags ({how}): {listing(names, 20)}"
    return TagMap(names, ids), [note], problems


def _canonical(words: list[list[str]], tags: list | None, tag_map: TagMap | None) -> datasets.Dataset:
    data: dict = {"tokens": words}
    features = {"tokens": datasets.List(datasets.Value("string"))}
    if tags is not None and tag_map is not None:
        data["label"] = [[x if tag_map.ids is None else tag_map.ids[str(x)] for x in row] for row in tags]
        features["label"] = datasets.List(datasets.Value("int64"))
    return datasets.Dataset.from_dict(data, features=datasets.Features(features))


def load_and_validate(cfg: DataConfig, *, seed: int, batch_size: int, known_labels: list[str] | None = None
                      ) -> PreparedData:
    """The training and eval rows of ``cfg``, validated: one DataError listing every problem."""
    notes: list[str] = []
    with using_cache_dir(cfg.cache_dir):
        train_part, eval_part = _parts(cfg)
    parts = [p for p in (train_part, eval_part) if p is not None]
    problems: list[str] = []
    words_col, tags_col, more = _columns(cfg, train_part, notes, need_tags=True)
    problems += more
    if eval_part is not None and not more:
        for col, what in ((words_col, "words"), (tags_col, "tags")):
            if col not in eval_part.ds.column_names:
                problems.append(f"{eval_part.where}: no column {col!r} (the {what} column of the training data); "
                                f"columns: {', '.join(eval_part.ds.column_names)}")
    if problems:
        raise data_error(problems)
    checked = []
    for part in parts:
        words, tags, more = _check_rows(part, words_col, tags_col)
        checked.append((words, tags))
        problems += more
    if problems:
        raise data_error(problems)
    tag_map, tag_notes, more = _tag_map(cfg, [(p, c[1]) for p, c in zip(parts, checked)],
                                        _tag_names_of(train_part, tags_col), known_labels)
    if more or tag_map is None:
        raise data_error(more)
    notes += tag_notes
    train = _canonical(*checked[0], tag_map)
    evaluation = _canonical(*checked[1], tag_map) if eval_part is not None else None
    chosen = {"tokens": words_col, "label": tags_col}
    return prepared(cfg, train, evaluation, tag_map, chosen, notes, source_warnings(parts), seed=seed,
                    batch_size=batch_size)


def load_rows(path: str, cfg: DataConfig, *, require_labels: bool, known_labels: list[str] | None
              ) -> tuple[datasets.Dataset, list[str]]:
    """One source for ``predict`` / ``eval``: canonical ``tokens`` and, when present (or required), ``label``."""
    part = open_rows(path, cfg, opener=lambda spec: open_any(spec, None, cfg))
    notes: list[str] = []
    words_col, tags_col, problems = _columns(cfg, part, notes, need_tags=require_labels)
    if problems:
        raise data_error(problems)
    words, tags, problems = _check_rows(part, words_col, tags_col)
    if problems and tags_col is not None and not require_labels:  # predict: bad tags are left out, not fatal
        notes.append(f"tags of column {tags_col!r} left out: {problems[0]}")
        tags_col, tags = None, None
        words, _, problems = _check_rows(part, words_col, None)
    if problems:
        raise data_error(problems)
    tag_map = None
    if tags is not None:
        tag_map, tag_notes, more = _tag_map(cfg, [(part, tags)], _tag_names_of(part, tags_col), known_labels)
        if more and require_labels:
            raise data_error(more)
        notes += tag_notes if not more else [f"tags of column {tags_col!r} left out: {more[0]}"]
        tag_map = None if more else tag_map
    return _canonical(words, tags if tag_map is not None else None, tag_map), notes + source_warnings([part])


# ----------------------------------------------------------------------------------------------- processing


def _encode(batch: dict[str, list], tokenizer, max_length: int) -> dict[str, list]:
    enc = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=max_length)
    out = {k: enc[k] for k in MODEL_INPUTS if k in enc}
    out["length"] = [len(ids) for ids in enc["input_ids"]]
    word_ids = [[-1 if w is None else w for w in enc.word_ids(i)] for i in range(len(enc["input_ids"]))]
    out["word_ids"] = word_ids
    out["words"] = [len(w) for w in batch["tokens"]]
    out["words_kept"] = [len({w for w in ids if w >= 0}) for ids in word_ids]
    if "label" in batch:
        out["tags"] = batch["label"]
        out["n_first"] = [count_labelled(ids, all_tokens=False) for ids in word_ids]
        out["n_all"] = [count_labelled(ids, all_tokens=True) for ids in word_ids]
    return out


def count_labelled(word_ids: list[int], *, all_tokens: bool) -> int:
    """How many sub-tokens carry a label: every one of a word (``all_tokens``) or the first of each word."""
    return sum(1 for p, w in enumerate(word_ids) if w >= 0 and (all_tokens or p == 0 or word_ids[p - 1] != w))


def process(dataset: datasets.Dataset, tokenizer, cfg: DataConfig, desc: str = "Tokenizing") -> datasets.Dataset:
    """Canonical rows (tokens, [label]) -> input_ids, attention_mask, [token_type_ids], word_ids, [tags, n_first,
    n_all], words, words_kept, length (cached by datasets). Logs how many words ``data.max_length`` cut off."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"token classification needs a fast tokenizer (its word_ids align tags with sub-tokens); "
                        f"{type(tokenizer).__name__} is not one")
    out = tokenizer_map(dataset, _encode, {"tokenizer": tokenizer, "max_length": cfg.max_length}, batched=True,
                        batch_size=1000, remove_columns=[c for c in ("tokens", "label") if c in dataset.column_names],
                        desc=desc)
    if report := truncation_report(out, cfg.max_length):
        log.warning("warning: %s: %s", desc.replace("Processing ", "") or "data", report)
    return out


def truncation_report(processed: datasets.Dataset, max_length: int) -> str | None:
    """What ``data.max_length`` cut off: sentences and words that lost their labels; None when nothing."""
    if len(processed) == 0:
        return None
    words = np.asarray(processed["words"])
    lost = words - np.asarray(processed["words_kept"])
    cut = int((lost > 0).sum())
    if not cut:
        return None
    return (f"{cut} of {len(words)} sentences are longer than data.max_length={max_length} tokens: "
            f"{int(lost.sum())} of {int(words.sum())} words lost their labels (not trained on, not evaluated, "
            "predicted as O); raise data.max_length to keep them")


class TokenCollator(TextCollator):
    """The text collator's padded inputs and ``loss_weight``, plus ``labels`` per sub-token (-100: no label)."""

    def __init__(self, pad_token_id: int, *, pad_to: int | None = None, multiple_of: int | None = None,
                 all_tokens: bool = False):
        super().__init__(pad_token_id, pad_to=pad_to, multiple_of=multiple_of)
        self.all_tokens = all_tokens

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        out = super().__call__([{k: v for k, v in r.items() if k in MODEL_INPUTS or k == "loss_weight"}
                                for r in rows])
        if "tags" in rows[0]:
            width = out["input_ids"].shape[1]
            labels = np.full((len(rows), width), IGNORE, dtype=np.int64)
            for i, r in enumerate(rows):
                labels[i, :min(width, len(r["word_ids"]))] = align(r["word_ids"], r["tags"], self.all_tokens)[:width]
            out["labels"] = torch.from_numpy(labels)
        return out


def align(word_ids: list[int], tags: list[int], all_tokens: bool = False) -> np.ndarray:
    """Per sub-token labels: the word's tag on its first sub-token (on every one with ``all_tokens``), -100 on
    special tokens and, by default, on the later sub-tokens of a word."""
    ids = np.asarray(word_ids, dtype=np.int64)
    tags_arr = np.asarray(tags, dtype=np.int64)
    real = ids >= 0
    keep = real.copy()
    if not all_tokens:
        keep[1:] &= ids[1:] != ids[:-1]
    out = np.full(len(ids), IGNORE, dtype=np.int64)
    out[keep] = tags_arr[ids[keep]]
    return out


def collator(tokenizer, cfg: DataConfig, *, train: bool, seed: int = 0, device_type: str = "cpu") -> TokenCollator:
    """Training batches label what ``data.label_all_tokens`` says; evaluation always the first sub-token of each
    word (the metrics are per word)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return TokenCollator(pad_id, pad_to=cfg.max_length if cfg.batching == "padded" else None,
                         multiple_of=pad_multiple(device_type), all_tokens=train and cfg.label_all_tokens)
