"""The text loader: load the configured text data, check all of it in one pass, and return canonical datasets.

Every problem found (missing file, malformed row, missing column, blank text, missing or unknown label) is
collected, and they are raised together as one DataError, before any model or worker process is started.
The datasets returned keep only ``text``, optional ``text_pair`` and ``label`` (an int64 id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import datasets
import pyarrow.compute as pc

from leantrain.config import DataConfig
from leantrain.data import columns as cols_
from leantrain.data.demo import demo_files
from leantrain.data.labels import LabelMap, from_data, from_known, missing, nonzero, scan
from leantrain.data.caches import using_cache_dir
from leantrain.data.conll import looks_like_conll, looks_like_tags
from leantrain.data.label_columns import LABELS, label_columns, merge_label_columns
from leantrain.data.label_sets import label_set_labels, looks_like_label_sets
from leantrain.data.lm import preference_formats as pf
from leantrain.data.scores import looks_like_scores, score_labels
from leantrain.data.sources import Part, SourceError, open_source, pick_split, quiet
from leantrain.errors import DataError, problems_error


@dataclass
class PreparedData:
    train: datasets.Dataset | None  # canonical columns: text, optional text_pair, label (int id)
    eval: datasets.Dataset | None  # same columns
    label_names: list[str]  # id -> name
    columns: dict[str, str | None]  # {"text": user column, "text_pair": user column or None, "label": user column}
    notes: list[str] = field(default_factory=list)  # choices made (auto-detected columns, hold-out, label order)
    warnings: list[str] = field(default_factory=list)  # e.g. fewer training examples than one batch
    # a side whose rows are generated from (prompts): (tokenizer (a callable giving it), new tokens, (positions,
    # where that number comes from), key) -> the problems of the rows too long for the model with the new tokens
    room: Callable | None = field(default=None, repr=False, compare=False)
    # a side whose rows are rendered into tokens (instruction, preference, prompt data): (tokenizer, n) -> the first n
    # training rows as the model sees them (``data.lm.masks.RenderedRow``: ids, trained tokens), checked before training
    rendered: Callable | None = field(default=None, repr=False, compare=False)


def load_and_validate(cfg: DataConfig, *, seed: int, batch_size: int, known_labels: list[str] | None = None,
                      labels: str = "classes") -> PreparedData:
    """The training and eval data of ``cfg``, validated; raises one DataError listing every problem. ``labels``:
    how the labels are read, ``classes`` (ids of names) or ``scores`` (numbers, regression)."""
    notes: list[str] = []
    train_spec, eval_spec = cfg.train, cfg.eval
    if train_spec is None:
        demo_train, demo_eval = demo_files()
        train_spec, eval_spec = str(demo_train), eval_spec or str(demo_eval)
        notes.append("data: the built-in demo dataset (set data.train to use your own)")
    train_part, eval_part = open_parts(cfg, train_spec, eval_spec, notes)
    parts = [train_part] + ([eval_part] if eval_part is not None else [])
    given = cfg.label_column
    cfg, known_labels, problems = _label_columns(cfg, parts, notes, known_labels, labels, required=True)

    chosen, more_notes, more = cols_.detect(cfg, train_part, need_label=True)
    problems += more
    notes += more_notes
    if eval_part is not None:
        problems += cols_.check_present(eval_part, chosen)
    warnings, more = _check_texts(parts, chosen)
    warnings = source_warnings(parts) + warnings
    problems += more
    label_map, label_notes, label_warnings, more = LABEL_READERS[labels](cfg, chosen["label"], parts, known_labels)
    notes, warnings, problems = notes + label_notes, warnings + label_warnings, problems + more
    if problems or label_map is None:
        raise data_error(problems)

    train = _canonical(train_part, chosen, label_map)
    evaluation = _canonical(eval_part, chosen, label_map) if eval_part is not None else None
    _report_label_columns(given, chosen)
    return prepared(cfg, train, evaluation, label_map, chosen, notes, warnings, seed=seed, batch_size=batch_size)


def prepared(cfg: DataConfig, train, evaluation, label_map, chosen, notes, warnings, *, seed: int,
             batch_size: int) -> PreparedData:
    """The canonical splits, finished the same way for every modality: a seeded hold-out when there is no eval
    data, the first-N cuts, and the fewer-than-one-batch warning."""
    if evaluation is None:
        train, evaluation = _hold_out(train, cfg.eval_fraction, seed, notes)
    train = first_rows(train, cfg.max_train_samples, "data.max_train_samples", "training", notes)
    evaluation = first_rows(evaluation, cfg.max_eval_samples, "data.max_eval_samples", "eval", notes)
    if isinstance(label_map, LabelMap):
        _one_class(train, label_map, chosen)
    if len(train) < batch_size:
        warnings.append(f"only {len(train)} training examples, fewer than one batch (train.batch_size={batch_size})")
    return PreparedData(train, evaluation, label_map.names, chosen, notes, warnings)


def _one_class(train: datasets.Dataset, label_map, chosen) -> None:  # noqa: ANN001
    """A classifier needs two classes in its training data: one class trains to loss 0 and accuracy 1.0."""
    if "label" not in train.column_names or len(train) == 0:
        return
    ids = pc.unique(train.with_format("arrow")["label"]).to_pylist()
    if len(ids) == 1:
        name = label_map.names[ids[0]] if 0 <= ids[0] < len(label_map.names) else ids[0]
        col = chosen.get("label") or "label"
        raise data_error([f"data.train: every training row has the same label, {name!r} in column {col!r}: a classifier "
                      "needs at least 2 classes in its training data (is data.label_column the right column? did "
                      "data.max_train_samples or the eval hold-out leave one class?)"])


def load_rows(path: str, cfg: DataConfig, *, require_labels: bool, known_labels: list[str] | None,
              labels: str = "classes") -> tuple[datasets.Dataset, list[str]]:
    """One source for ``predict`` / ``eval``, canonical columns; ``label`` only when present (or required)."""
    part = open_rows(path, cfg)
    problems = [f"{part.where} has no rows"] if len(part.ds) == 0 else []
    given = cfg.label_column
    cfg, known_labels, more = _label_columns(cfg, [part], [], known_labels, labels, required=require_labels)
    problems += more
    chosen, notes, more = cols_.detect(cfg, part, need_label=require_labels)
    warnings, texts = _check_texts([part], chosen)
    warnings = source_warnings([part]) + warnings
    problems += more + texts
    label_map, label_notes, more = rows_labels(cfg, part, chosen, known_labels, require_labels, labels)
    notes += label_notes
    problems += more
    if problems:
        raise data_error(problems)
    rows = _canonical(part, chosen, label_map)
    _report_label_columns(given, chosen)
    return rows, notes + warnings


def _label_columns(cfg: DataConfig, parts: list[Part], notes: list[str], known: list[str] | None, labels: str, *,
                   required: bool) -> tuple[DataConfig, list[str] | None, list[str]]:
    """``data.label_column=[a, b, c]`` (0/1 columns, multi-label): merged into one label-set column
    (``leantrain.data.label_columns``) -> (config reading it, the label names in the listed order, problems);
    otherwise ``cfg`` and ``known`` unchanged."""
    names = label_columns(cfg)
    if names is None:
        return cfg, known, []
    if labels != "label_sets":
        return cfg, known, [f"data.label_column lists several columns ({', '.join(names)}): that is multi-label "
                            "data; set model.task=multi-label (or auto)"]
    merged, more_notes, problems = merge_label_columns(cfg, parts, required=required)
    if problems:  # the 0/1 columns are wrong: nothing else can be read right
        raise data_error(problems)
    notes += more_notes
    return merged, known if known is not None else names, []


def _report_label_columns(given, chosen: cols_.Columns) -> None:  # noqa: ANN001 - data.label_column as set
    """The merged 0/1 columns are reported (summary.json, model/leantrain.json) as the list the user gave."""
    if chosen.get("label") == LABELS:
        chosen["label"] = list(given)


# ----------------------------------------------------------------------------------------------- steps


def open_rows(path: str, cfg: DataConfig, folder_reader=None, opener=None) -> Part:  # noqa: ANN001
    """The one split of ``path`` that predict / eval read (validation, then test, or data.eval_split).
    ``opener(path)``: how the source is opened, when not ``open_source`` (token classification: CoNLL files too)."""
    try:
        with using_cache_dir(cfg.cache_dir):
            source = opener(path) if opener else open_source(path, None, folder_reader, quoting=cfg.quoting)
        wanted = [cfg.eval_split] if cfg.eval_split else ["validation", "test"]
        part = pick_split(source, wanted, setting="data.eval_split" if cfg.eval_split else None, single_ok=True)
    except SourceError as e:
        raise data_error([str(e)]) from None
    if part is None:
        raise data_error([f"{path}: several splits ({', '.join(source.data)}) and none is named validation or test; "
                      "set data.eval_split"])
    return part


def source_warnings(parts: list[Part]) -> list[str]:
    """What opening the files found (a column name twice, rows over several lines), once per source."""
    out: list[str] = []
    for source in {id(p.source): p.source for p in parts}.values():
        out += [w for w in source.warnings if w not in out]
    return out


def data_error(problems: list[str], hints: list[str] | None = None) -> DataError:
    """One DataError listing every problem found (text and media loaders alike); a line standing for several rows
    counts as those rows (``errors.more_rows``); ``hints`` follow, not counted."""
    return problems_error(problems, hints)


def open_parts(cfg: DataConfig, train_spec: str, eval_spec: str | None, notes: list[str], folder_reader=None
               ) -> tuple[Part, Part | None]:  # noqa: ANN001 - folder_reader: see sources.open_source
    """The train split and the eval split (None: hold out from train); one DataError for all that fails."""
    problems: list[str] = []
    sources = {}
    for key, spec in (("data.train", train_spec), ("data.eval", eval_spec)):
        try:
            sources[key] = open_source(spec, key, folder_reader, quoting=cfg.quoting) if spec is not None else None
        except SourceError as e:
            problems.append(str(e))
    if problems:
        raise data_error(problems)
    train_src, eval_src = sources["data.train"], sources["data.eval"]
    train_part = eval_part = None
    try:
        train_part = pick_split(train_src, [cfg.train_split], setting="data.train_split", single_ok=False)
        if eval_src is not None:
            eval_part = _eval_split(cfg, eval_src, [cfg.eval_split] if cfg.eval_split else ["validation", "test"])
        elif isinstance(train_src.data, datasets.DatasetDict):
            wanted = [cfg.eval_split] if cfg.eval_split else [s for s in ("validation", "test") if s != cfg.train_split]
            eval_part = pick_split(train_src, wanted, setting="data.eval_split" if cfg.eval_split else None,
                                   single_ok=False)
            if eval_part is not None:
                eval_part.key = "data.eval"
        elif cfg.eval_split:
            problems.append(f"data.eval_split={cfg.eval_split!r}, but data.train ({train_spec}) has no splits; "
                            "set data.eval to a file instead")
    except SourceError as e:
        problems.append(str(e))
    for part in (train_part, eval_part):
        if part is not None and len(part.ds) == 0:
            problems.append(f"{part.where} has no rows")
        if part is not None and part.split is not None:
            splits = ", ".join(part.source.data)
            notes.append(f"{'training' if part is train_part else 'eval'} data: {part.name} (splits: {splits})")
    if problems:
        raise data_error(problems)
    return train_part, eval_part


def _eval_split(cfg: DataConfig, source, wanted: list[str]) -> Part:  # noqa: ANN001
    part = pick_split(source, wanted, setting="data.eval_split" if cfg.eval_split else None, single_ok=True)
    if part is None:
        raise SourceError(f"data.eval: {source.spec} has several splits ({', '.join(source.data)}) and none is "
                          "named validation or test; set data.eval_split")
    return part


def _check_texts(parts: list[Part], chosen: cols_.Columns) -> tuple[list[str], list[str]]:
    """(warnings, problems): text columns that are not strings; missing, empty or whitespace-only texts."""
    warnings, problems = [], []
    for part in parts:
        more_warnings, more = cols_.check_text_types(part, chosen)
        warnings, problems = warnings + more_warnings, problems + more
        for role in ("text", "text_pair"):
            name = chosen[role]
            if name is None or name not in part.ds.column_names or not isinstance(part.ds.features[name], datasets.Value):
                continue
            values = part.ds.with_format("arrow")[name]
            blank = pc.is_null(values)
            if cols_.is_text(part.ds.features[name]):
                blank = pc.or_kleene(blank, pc.equal(pc.utf8_trim_whitespace(values), ""))
            idx = nonzero(blank)
            if idx.size:
                what = "text" if role == "text" else "second text (text pair)"
                problems.append(f"{part.where}: {len(idx)} row{'s' if len(idx) > 1 else ''} with a missing or blank "
                                f"{what} in column {name!r} ({part.rows(idx)})")
    return warnings, problems


def rows_labels(cfg: DataConfig, part: Part, chosen: dict, known_labels: list[str] | None,
                require_labels: bool, labels: str = "classes") -> tuple[dict | None, list[str], list[str]]:
    """Labels of one predict/eval source -> (label map, notes, problems). Label problems are problems when the
    labels are required (eval), else the labels are left out with a note (predict)."""
    if chosen["label"] is None:
        return None, [], []
    label_map, label_notes, label_warnings, more = LABEL_READERS[labels](cfg, chosen["label"], [part], known_labels)
    if more and not require_labels:
        note = f"labels of column {chosen['label']!r} left out: {more[0]}"
        chosen["label"] = None
        return None, [note], []
    return label_map, label_notes + label_warnings, more


def label_map_of(cfg: DataConfig, col: str | None, parts: list[Part], known: list[str] | None
                 ) -> tuple[LabelMap | None, list[str], list[str], list[str]]:
    """The label map of the data (text and media loaders alike): (map, notes, warnings, problems); parts[0] is the training data (or the one input of load_rows)."""
    scans, problems = [], []
    for part in parts:
        if col is None or col not in part.ds.column_names:
            continue
        try:
            labels = scan(part, col)
        except SourceError as e:
            problems.append(str(e))
            continue
        problems += missing(part, labels, col)
        scans.append((part, labels))
    if not scans or scans[0][0] is not parts[0]:
        return None, [], [], problems
    if known is not None:
        label_map, notes, more = from_known(known, scans)
        return (None if problems or more else label_map), notes, [], problems + more
    label_map, notes, warnings, more = from_data(cfg, col, scans[0], scans[1:])
    return (None if problems or more else label_map), notes, warnings, problems + more


LABEL_READERS = {"classes": label_map_of, "scores": score_labels, "label_sets": label_set_labels}


def label_kind(cfg: DataConfig) -> str:
    """``pairs`` for preference data (chosen / rejected), ``tags`` for a CoNLL file or rows with a list of words and a list of tags (token classification),
    ``label_sets`` when the training labels are lists (or data.label_separator is set, or data.label_column
    lists several 0/1 columns: multi-label), ``scores``
    when they are numbers that are not all whole (regression), else ``classes``:
    what ``model.task=auto`` reads from the data."""
    if label_columns(cfg) is not None:  # several 0/1 columns
        return "label_sets"
    train_spec = cfg.train if cfg.train is not None else str(demo_files()[0])
    if looks_like_conll(train_spec):
        return "tags"
    train_part, _ = open_parts(cfg, train_spec, None, [])
    if cfg.label_column is None and pf.table_format(train_part.ds):
        return "pairs"  # chosen / rejected pairs: a reward model on a sequence classifier
    if looks_like_tags(train_part.ds, cfg.tokens_column, cfg.label_column):
        return "tags"
    chosen, _, _ = cols_.detect(cfg, train_part, need_label=True)
    if looks_like_label_sets(train_part, chosen["label"], cfg.label_separator):
        return "label_sets"
    return "scores" if looks_like_scores(train_part, chosen["label"]) else "classes"


def _canonical(part: Part, chosen: cols_.Columns, label_map: LabelMap | None) -> datasets.Dataset:
    with quiet():
        ds = cols_.canonical(part.ds, chosen)
        return label_map.apply(ds) if label_map is not None and "label" in ds.column_names else ds


def _hold_out(train: datasets.Dataset, fraction: float, seed: int, notes: list[str]
              ) -> tuple[datasets.Dataset, datasets.Dataset]:
    try:
        with quiet():
            split = train.train_test_split(test_size=fraction, seed=seed)
    except ValueError as e:
        raise data_error([f"data.eval_fraction={fraction}: cannot hold out eval rows from {len(train)} training "
                      f"rows ({e}); set data.eval"]) from None
    notes.append(f"eval data: none given, so {len(split['test'])} of {len(train)} training rows ({fraction:.0%}) are "
                 f"held out (seed {seed}; set data.eval to use your own)")
    return split["train"], split["test"]


def first_rows(ds: datasets.Dataset, n: int | None, setting: str, what: str, notes: list[str]
               ) -> datasets.Dataset:
    """The first ``n`` rows (``setting``: data.max_train_samples / data.max_eval_samples), noted when it cuts."""
    if n is None or len(ds) <= n:
        return ds
    notes.append(f"{setting}: using the first {n} of {len(ds)} {what} rows")
    return ds.select(range(n))
