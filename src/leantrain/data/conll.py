"""Token-classification data: CoNLL column files and which rows hold words and tags.

A CoNLL file (any file whose extension is not a table format's: ``.conll``, ``.txt``, none, CoNLL-2003's
``eng.train``) holds one word per line,
whitespace-separated columns with the word first and the tag last (``EU NNP B-NP B-ORG``), a blank line between
sentences; ``-DOCSTART-`` lines are skipped. It is read into rows ``{"tokens": [...], "ner_tags": [...]}``, each
row remembering the file line its sentence starts on, so that messages name lines. JSON / JSONL / Parquet rows with a
list column of words (``data.tokens_column``; auto: tokens, words) and one of tags (``data.label_column``; auto:
ner_tags, tags, labels) are the other form; ``model.task=auto`` picks token classification for either.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import pyarrow as pa

from leantrain.data.columns import find
from leantrain.data.sources import FORMATS, Source, SourceError

TOKENS = ["tokens", "words"]
TAGS = ["ner_tags", "tags", "labels", "label", "ner"]


def is_conll_path(spec: str | None) -> bool:
    """A file leantrain reads as CoNLL columns: an existing file that is not CSV / TSV / JSON / JSONL / Parquet by
    its extension (``.conll``, ``.txt``, none, CoNLL-2003's ``eng.train`` / ``eng.testa``)."""
    if spec is None:
        return False
    path = Path(spec).expanduser()
    return path.is_file() and path.suffix.lower() not in FORMATS


def looks_like_conll(spec: str | None) -> bool:
    """``is_conll_path`` and its first lines are CoNLL columns (UTF-8 text, two or more fields): what
    ``model.task=auto`` takes for token classification (anything else keeps the usual unsupported-type message)."""
    if not is_conll_path(spec):
        return False
    try:
        with open(Path(spec).expanduser(), encoding="utf-8-sig") as f:
            lines = [ln.split() for _, ln in zip(range(50), f)]
    except (UnicodeDecodeError, OSError):
        return False
    fields = [ln for ln in lines if ln and ln[0] != "-DOCSTART-"]
    return bool(fields) and all(len(ln) >= 2 for ln in fields)


def read_conll(path: Path, key: str | None) -> Source:
    """The sentences of a CoNLL column file as a Source (rows: tokens, ner_tags; lines: each sentence's first)."""
    where = f"{key}: {path.name}" if key else path.name
    tokens: list[list[str]] = []
    tags: list[list[str]] = []
    starts: list[int] = []
    words: list[str] = []
    current: list[str] = []
    start = 0
    try:
        with open(path, encoding="utf-8-sig") as f:
            for n, line in enumerate(f, 1):
                fields = line.split()
                if fields and fields[0] == "-DOCSTART-":
                    continue
                if not fields:
                    if words:
                        tokens.append(words), tags.append(current), starts.append(start)
                    words, current = [], []
                    continue
                if len(fields) < 2:
                    raise SourceError(f"{where} line {n}: one column ({line.strip()!r}); read as a CoNLL file (its "
                                      "extension is not .csv .tsv .json .jsonl .parquet), whose lines hold the "
                                      "word first and its tag last, separated by whitespace")
                if not words:
                    start = n
                words.append(fields[0])
                current.append(fields[-1])
    except UnicodeDecodeError:
        raise SourceError(f"{where}: not valid UTF-8 text; save the file as UTF-8") from None
    if words:
        tokens.append(words), tags.append(current), starts.append(start)
    if not tokens:
        raise SourceError(f"{where} has no sentences (CoNLL: one word and its tag per line, a blank line between "
                          "sentences)")
    table = pa.table({"tokens": pa.array(tokens, pa.list_(pa.string())), "ner_tags": pa.array(tags, pa.list_(pa.string()))})
    return Source(key, str(path), "conll", datasets.Dataset(table), path, starts)


def is_list(feature: object) -> bool:
    return isinstance(feature, (datasets.Sequence, datasets.List)) if hasattr(datasets, "List") else \
        isinstance(feature, datasets.Sequence)


def tokens_column(ds: datasets.Dataset, setting: str | None) -> str | None:
    """The column of word lists: ``data.tokens_column`` if set (and present), else tokens / words when a list."""
    columns = ds.column_names
    if setting is not None:
        return setting if setting in columns else None
    for name in TOKENS:
        col = find(name, columns)
        if col is not None and is_list(ds.features[col]):
            return col
    return None


def tags_column(ds: datasets.Dataset, setting: str | None, tokens: str | None) -> str | None:
    """The column of tag lists: ``data.label_column`` if set (and present), else ner_tags / tags / labels / ..."""
    columns = [c for c in ds.column_names if c != tokens]
    if setting is not None:
        return setting if setting in columns else None
    for name in TAGS:
        col = find(name, columns)
        if col is not None and is_list(ds.features[col]):
            return col
    return None


def looks_like_tags(ds: datasets.Dataset, tokens_setting: str | None, label_setting: str | None) -> bool:
    """Rows with a list column of words and a list column of tags: token classification (``model.task=auto``)."""
    tokens = tokens_column(ds, tokens_setting)
    return tokens is not None and tags_column(ds, label_setting, tokens) is not None
