"""Open a data source (file, saved folder, dataset folder or Hub name) as a ``datasets`` Dataset or DatasetDict.

Files go through ``datasets.load_dataset(<builder>, data_files=...)`` so that they get the Arrow cache. Loader
errors are cryptic, so CSV/TSV files get a structure check with the ``csv`` module first (it also catches rows
with too few or too many fields, which pandas would silently fill or shift), and JSON files get a diagnostic
pass when loading fails. Every message names the config key, the file and the line.
"""

from __future__ import annotations

import csv
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import datasets

from leantrain.data.caches import datasets_cache_dir, default_datasets_cache, record_dataset_cache
from leantrain.errors import SourceError  # noqa: F401 - raised here, imported from here by the readers
from leantrain.files import content_digest

FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl",
           ".parquet": "parquet", ".pq": "parquet"}
csv.field_size_limit(2**31 - 1)  # long documents are fine; the default limit is 128 KiB per field


@dataclass
class Source:
    key: str | None  # config key in messages ("data.train"), None for a command-line input
    spec: str  # what the user wrote
    kind: str  # csv | tsv | jsonl | json | parquet | disk | folder | hub
    data: datasets.Dataset | datasets.DatasetDict
    path: Path | None = None
    _lines: list[int] | None = field(default=None, repr=False)
    warnings: list[str] = field(default_factory=list)  # e.g. a column name given twice, rows spanning lines

    def line_numbers(self) -> list[int] | None:
        """File line of each data row (CSV/TSV/JSON lines), else None (rows are then numbered from 1)."""
        if self._lines is None and self.kind == "jsonl" and self.path is not None:
            with open(self.path, encoding="utf-8-sig") as f:
                self._lines = [n for n, line in enumerate(f, 1) if line.strip()]
        return self._lines


@dataclass
class Part:
    """One split of a source: the Dataset, and how to name it and its rows in messages."""

    source: Source
    ds: datasets.Dataset
    split: str | None = None
    key: str | None = None  # when it differs from the source's: the eval split of data.train is data.eval

    @property
    def name(self) -> str:
        base = self.source.path.name if self.source.path is not None and self.source.kind != "folder" else self.source.spec
        return f"split {self.split!r} of {base}" if self.split is not None else base

    @property
    def where(self) -> str:
        """``data.train: train.csv`` — the start of every message about this part."""
        key = self.key or self.source.key
        return f"{key}: {self.name}" if key else self.name

    def rows(self, indices: Sequence[int], limit: int = 5) -> str:
        """``lines 3, 8 and 2 more`` for files with line numbers, else ``rows 3, 8``."""
        lines = self.source.line_numbers()
        nums = [lines[i] if lines is not None else i + 1 for i in indices[:limit]]
        word = ("line" if lines is not None else "row") + ("s" if len(indices) > 1 else "")
        more = f" and {len(indices) - limit} more" if len(indices) > limit else ""
        return f"{word} {', '.join(map(str, nums))}{more}"


@contextmanager
def quiet() -> Iterator[None]:
    """No ``datasets`` progress bars while loading and mapping; the caller prints what matters."""
    was_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            datasets.enable_progress_bars()


# ----------------------------------------------------------------------------------------------- opening


def open_source(spec: str, key: str | None, folder_reader=None, quoting: str = "auto") -> Source:  # noqa: ANN001
    """Load ``spec`` (a path or a Hub name). Raises SourceError with a message that names key and file.

    ``folder_reader(path, spec, key) -> Source`` reads a plain folder instead of ``datasets.load_dataset``
    (images and audio: a folder per class, see data/media.py)."""
    pre = f"{key}: " if key else ""
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            try:
                with quiet():
                    return Source(key, spec, "disk", datasets.load_from_disk(str(path)), path)
            except Exception as e:  # noqa: BLE001 - any loader failure becomes one clear message
                raise SourceError(f"{pre}{spec}: not a readable save_to_disk folder ({_cause(e)})") from None
        if not any(path.iterdir()):
            raise SourceError(f"{pre}folder {spec} is empty")
        if folder_reader is not None:
            return folder_reader(path, spec, key)
        return Source(key, spec, "folder", _load_named(str(path), pre, f"folder {spec}:"), path)
    suffix = path.suffix.lower()
    if path.is_file():
        if suffix not in FORMATS:
            raise SourceError(f"{pre}{path.name}: unsupported file type {suffix or '(no extension)'!r}; use "
                              ".csv, .tsv, .json, .jsonl, .parquet or a dataset folder")
        return _open_file(path, FORMATS[suffix], key, quoting)
    if suffix in FORMATS or spec.startswith(("/", "./", "../", "~")):
        raise SourceError(f"{pre}file not found: {path.resolve() if not spec.startswith('~') else path}")
    return Source(key, spec, "hub", _load_named(spec, pre, f"{spec!r} is not a local file or folder, and"))


def content_config(path: Path) -> str:
    """The ``datasets`` config name a file is loaded under: its content's sha256. datasets keys its Arrow copy of a
    local file by the file's modification time, so a file rewritten with the same size and time would be read as
    its old rows (and everything processed from them, and values precomputed from those); under a name of its
    content, another content is another cache (the copy, and every ``map`` after it, whose fingerprints derive
    from it). One hash of the file per process (``content_digest``): 0.93 s for 100 MB here (2 shared cores)."""
    return f"sha256-{content_digest(path)[:24]}"


def quotes_on(quoting: str, delimiter: str) -> bool:
    """data.quoting: auto and standard honour CSV quoting ("a<tab>b", "" for a quote) in CSV and TSV files alike
    (GLUE's MRPC and STS-B TSVs are quoted so; reading them with quotes off would corrupt 1 text in 5); none reads
    quote characters as text. What auto adds is the check in ``check_csv``: a quoted field holding the delimiter and
    a line break, the signature of a stray quote merging rows, is refused with its lines."""
    return quoting != "none"


def _open_file(path: Path, fmt: str, key: str | None, quoting: str = "auto") -> Source:
    where = f"{key}: {path.name}" if key else path.name
    lines, kwargs, warnings = None, {}, []
    if fmt in ("csv", "tsv"):
        delimiter = "," if fmt == "csv" else "\t"
        lines = check_csv(path, delimiter, where, quoting, warnings)
        # Only an empty field is missing: "NA", "null" and "None" are ordinary texts and labels.
        kwargs = {"delimiter": delimiter, "keep_default_na": False, "na_values": [""],
                  "quoting": csv.QUOTE_MINIMAL if quotes_on(quoting, delimiter) else csv.QUOTE_NONE}
    elif fmt == "json" and _first_char(path) != "[":
        fmt = "jsonl"  # a .json file of JSON lines
    if fmt in ("json", "jsonl"):
        check_utf8(path, where)  # pyarrow's JSON reader passes bad bytes on, to fail when a row is read
    builder = {"tsv": "csv", "jsonl": "json"}.get(fmt, fmt)
    try:
        with quiet():
            ds = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=datasets_cache_dir(),
                                       name=content_config(path), **kwargs)
    except Exception as e:  # noqa: BLE001
        diagnose = {"json": diagnose_json, "parquet": _diagnose_parquet}.get(builder)
        found = diagnose(path, where) if diagnose else None
        raise SourceError(found or f"{where}: could not be read as {fmt.upper()} ({_cause(e)})") from None
    if lines is not None and len(ds) != len(lines):  # the loader and the structure check must agree on the rows
        raise SourceError(f"{where}: read {len(ds)} rows, but the file holds {len(lines)} (rows start on lines "
                          f"{', '.join(map(str, lines[:3]))}, ...); check the quoting (data.quoting)")
    record_dataset_cache(ds, str(path))
    return Source(key, str(path), fmt, ds, path, lines, warnings=warnings)


def _load_named(name: str, pre: str, what: str) -> datasets.Dataset | datasets.DatasetDict:
    """A dataset folder or a Hub name, through ``datasets.load_dataset``."""
    try:
        with quiet():
            ds = datasets.load_dataset(name, cache_dir=datasets_cache_dir())
    except Exception as e:  # noqa: BLE001
        if _offline() and not Path(name).exists():
            raise SourceError(f"{pre}{what} it is not in the datasets cache ({default_datasets_cache()}) and the Hub "
                              "is offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set): load it once with network "
                              "access (or with data.cache_dir pointing to a cache that has it), or save it with "
                              "save_to_disk and give that folder; data files need one of the extensions .csv .tsv "
                              ".json .jsonl .parquet") from None
        raise SourceError(f"{pre}{what} datasets.load_dataset could not load it ({_cause(e)}); data files need one "
                          "of the extensions .csv .tsv .json .jsonl .parquet") from None
    record_dataset_cache(ds, name)
    return ds


def _offline() -> bool:
    return bool(getattr(datasets.config, "HF_HUB_OFFLINE", False) or getattr(datasets.config, "HF_DATASETS_OFFLINE",
                                                                              False))


def _cause(e: BaseException) -> str:
    inner = e.__cause__ or e.__context__ or e
    text = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {text[0] if text else ''}".rstrip(": ")


def _first_char(path: Path) -> str:
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        while chunk := f.read(4096):
            if chunk.strip():
                return chunk.strip()[0]
    return ""


# ----------------------------------------------------------------------------------------------- diagnostics


def check_csv(path: Path, delimiter: str, where: str, quoting: str = "auto", warnings: list[str] | None = None
              ) -> list[int]:
    """The file line where each data row starts; SourceError naming the first malformed line, if any.

    With quotes on (``quotes_on``), a row that spans several lines is reported in ``warnings`` with its lines, and
    a quoted field holding the delimiter and a line break (a stray quote merging rows) is an error unless the
    user asked for quotes (data.quoting=standard)."""
    starts: list[int] = []
    bad: list[tuple[int, int, int]] = []  # (first line, last line, fields)
    spans: list[tuple[int, int]] = []  # rows over several lines
    merged: list[tuple[int, int]] = []  # ... whose text holds the delimiter and a line break
    warnings = warnings if warnings is not None else []
    reader = None
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            on = quotes_on(quoting, delimiter)
            reader = csv.reader(f, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL if on else csv.QUOTE_NONE)
            header = next((row for row in reader if row), None)
            if header is None:
                raise SourceError(f"{where} is empty (no header line)")
            warnings += _twice(where, header)
            width, prev = len(header), reader.line_num
            for row in reader:
                start, prev = prev + 1, reader.line_num
                if row:
                    starts.append(start)
                    if len(row) != width:
                        bad.append((start, prev, len(row)))
                    elif prev > start:
                        spans.append((start, prev))
                        if any(delimiter in v and "\n" in v for v in row):
                            merged.append((start, prev))
    except UnicodeDecodeError:
        raise SourceError(f"{where} line {_bad_utf8_line(path)}: not valid UTF-8 text; save the file as UTF-8") from None
    except csv.Error as e:
        raise SourceError(f"{where} line {reader.line_num if reader else 1}: {e}") from None
    if bad:
        raise SourceError(_describe_bad_rows(where, bad, width, delimiter))
    if not starts:
        raise SourceError(f"{where} has no rows (only a header line)")
    sep = "comma" if delimiter == "," else "tab"
    if merged and quoting != "standard":
        first, last = merged[0]
        raise SourceError(
            f"{where} line {first}: a quoted field runs on to line {last} and holds a {sep} and a line break: a "
            f"stray quote character (\") merging rows? {_listing(merged)}Set data.quoting=none to read quote "
            "characters as text, or data.quoting=standard if such fields are meant")
    if spans:
        warnings.append(f"{where}: {len(spans)} row{'s' if len(spans) > 1 else ''} span several lines (a quoted "
                        f"field holds a line break): {_listing(spans, lead='')}{len(starts)} rows from "
                        f"{reader.line_num} lines; set data.quoting=none if quotes are meant as text")
    return starts


def _listing(spans: list[tuple[int, int]], lead: str = "rows over several lines: ") -> str:
    shown = ", ".join(f"lines {a}-{b}" for a, b in spans[:5]) + (f" and {len(spans) - 5} more" if len(spans) > 5 else "")
    return f"{lead}{shown}; " if len(spans) > 1 or not lead else ""


def _twice(where: str, header: list[str]) -> list[str]:
    """A warning per column name that the header gives more than once (the loader renames the later ones)."""
    seen: dict[str, list[int]] = {}
    for i, name in enumerate(header, 1):
        seen.setdefault(name, []).append(i)
    return [f"{where}: column {name!r} appears {len(at)} times in the header (fields {', '.join(map(str, at))}); "
            f"the first is used as {name!r}, the others are renamed {name + '.1'!r}, ...; rename them"
            for name, at in seen.items() if len(at) > 1]


def _describe_bad_rows(where: str, bad: list[tuple[int, int, int]], width: int, delimiter: str) -> str:
    first, last, found = bad[0]
    text = f"{where} line {first}: expected {width} fields, found {found}"
    if last > first:
        text += f" (the row runs on to line {last}: is a quote character (\") left open?)"
    elif found > width:
        text += f" (a field that contains a {'comma' if delimiter == ',' else 'tab'} must be quoted)"
    if len(bad) > 1:
        more = ", ".join(str(b[0]) for b in bad[1:6]) + (", ..." if len(bad) > 6 else "")
        text += f"; {len(bad) - 1} more malformed line{'s' if len(bad) > 2 else ''} ({more})"
    return text


def check_utf8(path: Path, where: str, chunk: int = 1 << 22) -> None:
    """SourceError naming the first line that is not UTF-8 (the file read once, in pieces)."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with open(path, "rb") as f:
            while piece := f.read(chunk):
                decoder.decode(piece)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise SourceError(f"{where} line {_bad_utf8_line(path)}: not valid UTF-8 text; save the file as UTF-8"
                          ) from None


def _bad_utf8_line(path: Path) -> int:
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return n
    return 1


def diagnose_json(path: Path, where: str) -> str | None:
    """The first bad line of a JSON / JSON-lines file, or None when nothing is found."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        return f"{where} line {_bad_utf8_line(path)}: not valid UTF-8 text; save the file as UTF-8"
    if not text.strip():
        return f"{where} is empty"
    if text.lstrip()[0] == "[":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            return f"{where} line {e.lineno}: invalid JSON ({e.msg})"
        if not records:
            return f"{where} has no rows (an empty list)"
        kinds = [i for i, r in enumerate(records) if not isinstance(r, dict)]
        return f"{where} row {kinds[0] + 1}: expected an object {{...}}, found {_json_kind(records[kinds[0]])}" if kinds else None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            return f"{where} line {n}: invalid JSON ({e.msg})"
        if not isinstance(record, dict):
            return f"{where} line {n}: expected a JSON object {{...}}, found {_json_kind(record)}"
    return None


def _diagnose_parquet(path: Path, where: str) -> str | None:
    import pyarrow.parquet as pq

    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except Exception as e:  # noqa: BLE001
        return f"{where}: not a readable Parquet file ({type(e).__name__}: {e})"
    return f"{where} has no rows" if rows == 0 else None


def _json_kind(value: object) -> str:
    return {list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(type(value), "a number")


# ----------------------------------------------------------------------------------------------- splits


def pick_split(source: Source, wanted: Sequence[str], *, setting: str | None, single_ok: bool) -> Part | None:
    """The first split of ``wanted`` that exists (any single split if ``single_ok``), else None.

    ``setting`` names the config key that asked for the first of ``wanted`` explicitly; then a missing
    split is an error that lists the splits there are.
    """
    data = source.data
    if isinstance(data, datasets.Dataset):
        return Part(source, data)
    for name in wanted:
        if name in data:
            return Part(source, data[name], name)
    if single_ok and len(data) == 1:
        name = next(iter(data))
        return Part(source, data[name], name)
    if setting is not None:
        raise SourceError(f"{setting}: no split {wanted[0]!r} in {source.spec} "
                          f"(splits: {', '.join(data)}); set {setting} to one of them")
    return None
