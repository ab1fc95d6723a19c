"""Images and audio from files: load, check every file, return canonical datasets (``image`` or ``audio``: an
absolute path; ``label``: an int id) — the media counterpart of data/validate.py, reusing its steps.

Sources: a folder with a folder per class (``photos/cat/1.jpg``), optionally under split folders
(``photos/train/cat/1.jpg``, ``photos/test/...``); a folder holding ``metadata.csv`` / ``metadata.jsonl`` (the
Hugging Face imagefolder / audiofolder convention); or any tabular source (CSV, JSONL, ...) with a path column,
paths relative to the file. A flat folder of files is unlabelled data (for predict). Every file's header is read
before any model starts; missing and unreadable files are reported together, by path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import datasets

from leantrain.config import DataConfig
from leantrain.data import columns as cols_
from leantrain.data.sources import Part, Source, SourceError, open_source, quiet
from leantrain.data.text_loader import (PreparedData, data_error, label_map_of, open_parts, open_rows, prepared,
                                     rows_labels)

SPLIT_NAMES = {"train": "train", "training": "train", "test": "test", "testing": "test", "validation": "validation",
               "valid": "validation", "val": "validation", "dev": "validation"}
METADATA_FILES = ("metadata.csv", "metadata.jsonl")
PATH_COLUMNS = ("path", "file", "file_name", "filename", "filepath", "file_path")


@dataclass(frozen=True)
class MediaKind:
    role: str  # the canonical column: "image" | "audio"
    setting: str  # "data.image_column"
    extensions: tuple[str, ...]
    probe: Callable[[str], str | None]  # why a file cannot be read (from its header), or None
    names: tuple[str, ...]  # column names tried when the setting is unset


# ----------------------------------------------------------------------------------------------- folders


def folder_reader(kind: MediaKind):
    return lambda path, spec, key: scan_folder(path, spec, key, kind)


def scan_folder(path: Path, spec: str, key: str | None, kind: MediaKind) -> Source:
    """A folder as a Source: metadata file, split folders of class folders, class folders, or loose files."""
    for meta in METADATA_FILES:
        if (path / meta).is_file():
            return open_source(str(path / meta), key)
    pre = f"{key}: " if key else ""
    subdirs = _subdirs(path)
    if subdirs and not _files(path, kind) and all(d.name.lower() in SPLIT_NAMES for d in subdirs):
        data = datasets.DatasetDict({SPLIT_NAMES[d.name.lower()]: _classes(d, pre, kind) for d in subdirs})
    else:
        data = _classes(path, pre, kind)
    return Source(key, spec, "folder", data, path)


def _subdirs(folder: Path) -> list[Path]:
    return sorted(d for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))


def _files(folder: Path, kind: MediaKind, deep: bool = False) -> list[str]:
    found = folder.rglob("*") if deep else folder.iterdir()
    return sorted(str(f.resolve()) for f in found if f.is_file() and f.suffix.lower() in kind.extensions)


def _classes(folder: Path, pre: str, kind: MediaKind) -> datasets.Dataset:
    loose = _files(folder, kind)
    classes = {d.name: files for d in _subdirs(folder) if (files := _files(d, kind, deep=True))}
    if loose and classes:
        raise SourceError(f"{pre}{folder} holds {kind.role} files and class folders ({', '.join(list(classes)[:5])})"
                          "; put every file in the folder of its class (or use no class folders for unlabelled data)")
    if not loose and not classes:
        raise SourceError(f"{pre}{folder}: no {kind.role} files ({' '.join(kind.extensions)}) in it or its folders")
    if loose:
        return datasets.Dataset.from_dict({kind.role: loose})
    return datasets.Dataset.from_dict({kind.role: [f for files in classes.values() for f in files],
                                       "label": [c for c, files in classes.items() for _ in files]})


# ----------------------------------------------------------------------------------------------- columns, files


def detect(cfg: DataConfig, part: Part, kind: MediaKind, *, need_label: bool) -> tuple[dict, list[str], list[str]]:
    """({role: column, "label": column}, notes, problems) for ``part``."""
    columns = part.ds.column_names
    chosen: dict[str, str | None] = {kind.role: None, "label": None}
    notes, problems = [], []
    folder = part.source.kind == "folder"
    for role, setting, names in ((kind.role, kind.setting, kind.names + PATH_COLUMNS), ("label", "data.label_column",
                                                                                         cols_.LABELS)):
        name = getattr(cfg, setting.split(".")[1])
        if name is not None:
            chosen[role] = name if name in columns else None
            if name not in columns:
                problems.append(cols_.not_found(part.where, name, f"set by {setting}", columns))
            continue
        chosen[role] = next((c for n in names if (c := cols_.find(n, columns))), None)
        if chosen[role] is not None and not folder:
            notes.append(f"{role} column: {chosen[role]!r} (auto-detected; set {setting} to change)")
        elif chosen[role] is None and (role != "label" or need_label):
            problems.append(f"{part.where}: no {role} column found (columns: {', '.join(columns)}); set {setting}"
                            + ("; or use a folder per class" if role == "label" else ""))
    if folder and chosen["label"] is not None:
        notes.append(f"labels: the class folder names of {part.source.spec}")
    return chosen, notes, problems


def check_files(part: Part, col: str, kind: MediaKind) -> tuple[list[str], list[str]]:
    """(absolute paths, problems): blank paths, missing files and files whose header cannot be read."""
    feature = part.ds.features[col]
    if not cols_.is_text(feature):
        return [], [f"{part.where}: {kind.role} column {col!r} holds {feature}, not file paths"]
    base = part.source.path.parent if part.source.path is not None and part.source.kind != "folder" else Path.cwd()
    values = part.ds[col]
    blank = [i for i, v in enumerate(values) if v is None or not v.strip()]
    problems = [f"{part.where}: {len(blank)} row(s) with no path in column {col!r} ({part.rows(blank)})"] if blank else []
    paths = [str((base / Path(v).expanduser()).resolve()) if v and v.strip() else "" for v in values]
    missing = [i for i, p in enumerate(paths) if p and not Path(p).is_file()]
    if missing:
        shown = ", ".join(paths[i] for i in missing[:3]) + (", ..." if len(missing) > 3 else "")
        problems.append(f"{part.where}: {len(missing)} {kind.role} file(s) not found ({part.rows(missing)}): {shown}")
    skip = set(missing)
    bad = [(p, why) for i, p in enumerate(paths) if p and i not in skip and (why := kind.probe(p))]
    problems += [f"{part.where}: cannot read {kind.role} file {p} ({why})" for p, why in bad[:10]]
    if len(bad) > 10:
        problems.append(f"{part.where}: {len(bad) - 10} more unreadable {kind.role} files")
    return paths, problems


def _canonical(part: Part, chosen: dict, paths: list[str], kind: MediaKind, label_map) -> datasets.Dataset:
    with quiet():
        ds = part.ds.select_columns([chosen["label"]]) if chosen["label"] else datasets.Dataset.from_dict({})
        if chosen["label"]:
            ds = ds.rename_column(chosen["label"], "label") if chosen["label"] != "label" else ds
            ds = label_map.apply(ds).add_column(kind.role, paths)
            return ds.select_columns([kind.role, "label"])
        return datasets.Dataset.from_dict({kind.role: paths})


# ----------------------------------------------------------------------------------------------- entry points


def load_and_validate(cfg: DataConfig, kind: MediaKind, *, seed: int, batch_size: int,
                      known_labels: list[str] | None = None) -> PreparedData:
    """Training and eval data; one DataError listing every problem (columns, files, labels)."""
    if cfg.train is None:
        raise data_error([f"data.train: required for {kind.role} classification: a folder with a folder per class, or "
                      f"a CSV/JSONL file with a path column ({kind.setting}) and a label column"])
    notes: list[str] = []
    train_part, eval_part = open_parts(cfg, cfg.train, cfg.eval, notes, folder_reader(kind))
    parts = [train_part] + ([eval_part] if eval_part is not None else [])
    chosen, more_notes, problems = detect(cfg, train_part, kind, need_label=True)
    notes += more_notes
    if eval_part is not None:
        problems += cols_.check_present(eval_part, chosen)
    paths = {}
    for part in parts:
        if chosen[kind.role] in part.ds.column_names:
            paths[id(part)], more = check_files(part, chosen[kind.role], kind)
            problems += more
    label_map, label_notes, warnings, more = label_map_of(cfg, chosen["label"], parts, known_labels)
    notes, problems = notes + label_notes, problems + more
    if problems or label_map is None:
        raise data_error(problems)
    train = _canonical(train_part, chosen, paths[id(train_part)], kind, label_map)
    evaluation = _canonical(eval_part, chosen, paths[id(eval_part)], kind, label_map) if eval_part else None
    return prepared(cfg, train, evaluation, label_map, chosen, notes, warnings, seed=seed, batch_size=batch_size)


def load_rows(path: str, cfg: DataConfig, kind: MediaKind, *, require_labels: bool,
              known_labels: list[str] | None) -> tuple[datasets.Dataset, list[str]]:
    """One source for ``predict`` / ``eval`` (a flat folder of files too); ``label`` only when present."""
    part = open_rows(path, cfg, folder_reader(kind))
    chosen, notes, problems = detect(cfg, part, kind, need_label=require_labels)
    paths: list[str] = []
    if chosen[kind.role] is not None:
        paths, more = check_files(part, chosen[kind.role], kind)
        problems += more
    label_map, label_notes, more = rows_labels(cfg, part, chosen, known_labels, require_labels)
    notes += label_notes
    problems += more
    if problems:
        raise data_error(problems)
    return _canonical(part, chosen, paths, kind, label_map), notes
