"""Where a causal LM's text comes from: .txt files (one document per file, or split at a separator), one
tabular/JSON source with a text column, or a prepared token-shard folder; each named by a fingerprint of its
content, which keys the cache of prepared shards."""

from __future__ import annotations

import glob
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from leantrain.data.sources import SourceError, open_source, pick_split
from leantrain.data.lm.token_shards import INDEX, MANIFEST, TokenShards
from leantrain.files import content_digest, sha256_json

TEXT_SUFFIXES = (".txt", ".text")
READ_ROWS = 1000  # a tabular source's texts are read in batches of this many rows
READ_CHARS = 1 << 20  # .txt files with a document separator are read in pieces of this size

@dataclass
class TokenSource:
    """Where a causal LM's text comes from: .txt files, one tabular/JSON source with a text column, or a prepared
    folder (``manifest.json``). ``documents()`` streams the texts; ``fingerprint`` names the content."""

    key: str  # config key in messages ("data.train")
    specs: list[str]  # what the user wrote
    kind: str  # txt | table | prepared
    files: list[Path] = field(default_factory=list)  # txt: the files, in order
    separator: str | None = None  # txt: split files into documents here; None = one document per file
    dataset: object | None = None  # table: the datasets.Dataset (Arrow, memory-mapped)
    text_column: str | None = None  # table: the column read
    folder: Path | None = None  # prepared: the folder
    fingerprint: str = ""
    skipped: list[str] = field(default_factory=list)  # a folder's entries that are not .txt files (subfolders too)

    @property
    def where(self) -> str:
        return f"{self.key}: {', '.join(self.specs)}"

    def describe(self) -> dict:
        return {"specs": self.specs, "kind": self.kind, "text_column": self.text_column,
                "document_separator": self.separator, "fingerprint": self.fingerprint}

    def documents(self) -> Iterator[str]:
        """Every document's text in order (blank ones included; the writer skips them)."""
        if self.kind == "txt":
            for path in self.files:
                yield from _file_documents(path, self.separator, self.key)
        elif self.kind == "table":
            ds = self.dataset.select_columns([self.text_column])
            for batch in ds.iter(batch_size=READ_ROWS):
                yield from (t if isinstance(t, str) else "" for t in batch[self.text_column])
        else:
            raise ValueError("a prepared folder has no documents to read")

    def size_bytes(self) -> int:
        if self.kind == "txt":
            return sum(p.stat().st_size for p in self.files)
        if self.kind == "table":
            return int(getattr(self.dataset, "data").nbytes) if self.dataset is not None else 0
        return 0


def _file_documents(path: Path, separator: str | None, key: str = "data.train") -> Iterator[str]:
    try:
        with open(path, encoding="utf-8", errors="strict", newline="") as f:
            if separator is None:
                yield f.read()
                return
            rest = ""
            while True:
                piece = f.read(READ_CHARS)
                if not piece:
                    break
                parts = (rest + piece).split(separator)
                rest = parts.pop()
                yield from parts
            yield rest
    except UnicodeDecodeError as e:
        raise SourceError(f"{key}: {path}: not UTF-8 text ({e.reason}: byte {e.object[e.start:e.start + 1]!r}); "
                          "convert it to UTF-8") from None


def _is_glob(spec: str) -> bool:
    return any(c in spec for c in "*?[")


def open_token_source(specs: str | Iterable[str], key: str, *, text_column: str | None = None,
                      separator: str | None = None, split: str | None = "train", quoting: str = "auto",
                      eval_split: bool = False) -> TokenSource:
    """Resolve the sources of one split (``data.train`` or ``data.eval``; ``leantrain prepare``'s arguments).
    A multi-split tabular source gives ``split`` (eval: ``split``, else validation, else test). Raises SourceError
    naming the key and file."""
    specs = [specs] if isinstance(specs, str) else list(specs)
    if not specs:
        raise SourceError(f"{key}: no source given")
    texts: list[Path] = []
    others: list[str] = []
    skipped: list[str] = []  # what a folder of .txt files holds besides them
    for spec in specs:
        path = Path(spec).expanduser()
        if _is_glob(spec) and not path.exists():
            found = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
            if not found:
                raise SourceError(f"{key}: {spec} matches no file")
            for p in found:
                (texts.append(p) if p.suffix.lower() in TEXT_SUFFIXES else others.append(str(p)))
        elif path.is_dir() and (path / MANIFEST).is_file():
            if len(specs) > 1:
                raise SourceError(f"{key}: {spec} is a prepared folder; give it alone")
            shards = TokenShards.open(path, where=f"{key}: {spec}")
            return TokenSource(key, specs, "prepared", folder=path, fingerprint=shards.manifest["source"]["fingerprint"])
        elif path.is_dir() and ((path / INDEX).exists() or any(path.glob("tokens-*.bin"))):
            raise SourceError(f"{key}: {spec} holds token shards but no {MANIFEST}: a preparation that did not "
                              "finish (killed?); run leantrain prepare again")
        elif path.is_dir() and sorted(path.glob("*.txt")):
            texts += sorted(path.glob("*.txt"))
            skipped += sorted(f"{p.name}/" if p.is_dir() else p.name for p in path.iterdir()
                              if p.suffix.lower() != ".txt" or not p.is_file())
        elif path.suffix.lower() in TEXT_SUFFIXES:
            if not path.is_file():
                raise SourceError(f"{key}: file not found: {path}")
            texts.append(path)
        else:
            others.append(spec)
    if texts and others:
        raise SourceError(f"{key}: mixes .txt files with other sources ({', '.join(others[:3])}); use one kind")
    if len(others) > 1:
        raise SourceError(f"{key}: several tabular sources ({', '.join(others[:3])}); give one (or .txt files)")
    if texts:
        if separator == "":
            raise SourceError("data.document_separator: an empty separator; unset it for one document per file")
        stats = [(str(p.resolve()), content_digest(p)) for p in texts]  # the content: not size and time
        fp = sha256_json({"kind": "txt", "files": stats, "separator": separator})
        return TokenSource(key, specs, "txt", files=texts, separator=separator, fingerprint=fp, skipped=skipped)
    source = open_source(others[0], key, quoting=quoting)
    if eval_split:
        wanted, setting = ([split], "data.eval_split") if split else (["validation", "test"], None)
    else:
        wanted, setting = [split], "data.train_split"
    part = pick_split(source, wanted, setting=setting, single_ok=eval_split)
    if part is None:
        raise SourceError(f"{key}: {others[0]} has several splits ({', '.join(source.data)}) and none is named "
                          "validation or test; set data.eval_split")
    ds = part.ds
    column = _text_column(part, text_column)
    if source.path is not None and source.path.is_file():
        content = [str(source.path.resolve()), content_digest(source.path)]
    else:
        content = [others[0], getattr(ds, "_fingerprint", None)]
    fp = sha256_json({"kind": "table", "source": content, "split": part.split, "column": column})
    return TokenSource(key, specs, "table", dataset=ds, text_column=column, fingerprint=fp)


def _text_column(part, wanted: str | None) -> str:  # noqa: ANN001 - a sources.Part
    """The column holding the documents: ``wanted`` (data.text_column), else ``text``, else the only text column.
    A column meant as text that holds another value names the first such row and its value."""
    import datasets

    ds, where = part.ds, part.where
    strings = [c for c, f in ds.features.items() if isinstance(f, datasets.Value) and f.dtype in ("string", "large_string")]
    if wanted is not None and wanted not in ds.column_names:
        raise SourceError(f"{where}: no column {wanted!r} (data.text_column); columns: {', '.join(ds.column_names)}")
    meant = wanted or ("text" if "text" in ds.column_names else None)
    if meant is not None and meant not in strings:
        _not_text(part, meant, "(data.text_column)" if wanted else "")
    if meant is not None:
        return meant
    if len(strings) == 1:
        return strings[0]
    raise SourceError(f"{where}: set data.text_column to the column holding the documents (text columns: "
                      f"{', '.join(strings) or 'none'}; columns: {', '.join(ds.column_names)})")


def _not_text(part, column: str, key: str) -> None:  # noqa: ANN001 - a sources.Part
    """SourceError naming the first row of ``column`` that is not a string, and its value."""
    where, label = part.where, f"column {column!r}{' ' + key if key else ''}"
    for start in range(0, len(part.ds), READ_ROWS):
        values = part.ds[start:start + READ_ROWS][column]
        bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
        if bad is not None:
            value = values[bad]
            raise SourceError(f"{where} {part.rows([start + bad])}: {label} holds {value!r} ({type(value).__name__}), "
                              "not text; every document must be a string (quote it)")
    raise SourceError(f"{where}: {label} holds {part.ds.features[column]}, not text")
