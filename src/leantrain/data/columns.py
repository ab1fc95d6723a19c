"""Which columns hold the text, the second text of a pair and the label.

Explicit settings (data.text_column, data.text_pair_column, data.label_column) win; otherwise the usual names
are tried, pairs first; a label column with another name is taken when it is the one column besides the texts, or
the one that holds numbers or label lists. Every automatic choice is reported as a note, so the user sees it and
can change it.
"""

from __future__ import annotations

import difflib
from typing import Sequence

import datasets

from leantrain.config import DataConfig
from leantrain.data.sources import Part

PAIRS = [("sentence1", "sentence2"), ("question1", "question2"), ("premise", "hypothesis"),
         ("question", "sentence"), ("text", "text_pair")]
TEXTS = ["sentence", "text", "review", "content", "document", "utterance", "question"]
LABELS = ["label", "labels", "class", "category", "target", "y", "score", "rating", "sentiment", "gold_label", "stars"]
SETTINGS = {"text": "data.text_column", "text_pair": "data.text_pair_column", "label": "data.label_column"}
ROLE_NAMES = {"text": "text", "text_pair": "text pair", "label": "label", "image": "image", "audio": "audio"}

Columns = dict[str, "str | None"]  # {"text": ..., "text_pair": ..., "label": ...}: the user's column names


def find(name: str, columns: Sequence[str]) -> str | None:
    """``name`` among ``columns``: exactly, else ignoring case."""
    if name in columns:
        return name
    folded = [c for c in columns if c.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def not_found(where: str, name: str, why: str, columns: Sequence[str]) -> str:
    """``data.train: a.csv: no column 'sentense' (set by data.text_column); columns: ... — did you mean ...?``"""
    hint = difflib.get_close_matches(name, list(columns), n=1, cutoff=0.6)
    text = f"{where}: no column {name!r} ({why}); columns: {', '.join(columns) or 'none'}"
    return text + (f" — did you mean {hint[0]!r}?" if hint else "")


def is_text(feature: object) -> bool:
    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def detect(cfg: DataConfig, part: Part, *, need_label: bool) -> tuple[Columns, list[str], list[str]]:
    """(columns, notes, problems) for ``part``; a column that is set but absent is a problem that lists them."""
    columns = part.ds.column_names
    chosen: Columns = {"text": None, "text_pair": None, "label": None}
    notes: dict[str, str] = {}
    problems: list[str] = []
    for role, setting in SETTINGS.items():
        name = getattr(cfg, setting.split(".")[1])
        if name is not None and name in columns:
            chosen[role] = name
        elif name is not None:
            problems.append(not_found(part.where, name, f"set by {setting}", columns))

    def auto(role: str, name: str | None, why: str = "auto-detected") -> None:
        if name is not None:
            chosen[role] = name
            notes[role] = f"{ROLE_NAMES[role]} column: {name!r} ({why}; set {SETTINGS[role]} to change)"

    if cfg.label_column is None:
        auto("label", next((c for n in LABELS if (c := find(n, columns))), None))
        if chosen["label"] is None and need_label:
            problems.append(f"{part.where}: no label column found (columns: {', '.join(columns)}); "
                            "set data.label_column")
    if cfg.text_column is None:
        _detect_text(cfg, part, chosen, auto)
        if chosen["text"] is None:
            problems.append(f"{part.where}: no text column found (columns: {', '.join(columns)}); "
                            "set data.text_column")
    elif cfg.text_pair_column is None and chosen["text"] is not None:
        partner = next((find(b, columns) for a, b in PAIRS if a == chosen["text"] and find(b, columns)), None)
        if partner:
            notes["text_pair"] = (f"no text pair column: single texts from {chosen['text']!r} "
                                  f"(set data.text_pair_column={partner} to use pairs)")
    if chosen["label"] is None and cfg.label_column is None and need_label and chosen["text"] is not None:
        auto("label", *(_label_by_content(part, chosen) or (None,)))
        if chosen["label"] is not None:
            problems = [p for p in problems if "no label column found" not in p]
    problems += _same_column_twice(chosen)
    return chosen, [notes[r] for r in SETTINGS if r in notes], problems


def _detect_text(cfg: DataConfig, part: Part, chosen: Columns, auto) -> None:  # noqa: ANN001
    columns = [c for c in part.ds.column_names if c != chosen["label"]]
    pair = chosen["text_pair"]
    if cfg.text_pair_column is None:
        for a, b in PAIRS:
            if (first := find(a, columns)) and (second := find(b, columns)):
                auto("text", first), auto("text_pair", second)
                return
    elif pair is not None:  # the pair column is set: its usual partner, if there is one
        partner = next((find(a, columns) for a, b in PAIRS if b.lower() == pair.lower() and find(a, columns)), None)
        if partner:
            auto("text", partner)
            return
    columns = [c for c in columns if c != pair]
    single = next((c for n in TEXTS if (c := find(n, columns))), None)
    if single:
        auto("text", single)
        return
    strings = [c for c in columns if is_text(part.ds.features[c])]
    if len(strings) == 1:
        auto("text", strings[0], "the only text column")


def _label_by_content(part: Part, chosen: Columns) -> tuple[str, str] | None:
    """(column, why) when the label column is clear without its name: the only column besides the text columns,
    or the only one of them holding numbers, booleans, class labels or lists (multi-label)."""
    rest = [c for c in part.ds.column_names if c not in (chosen["text"], chosen["text_pair"])]
    if len(rest) == 1:
        return rest[0], "the only column besides the text"
    labels = [c for c in rest if _holds_labels(part.ds.features[c])]
    if len(labels) == 1:
        return labels[0], "the only column of numbers or labels besides the text"
    return None


def _holds_labels(feature: object) -> bool:
    if isinstance(feature, datasets.ClassLabel):
        return True
    if isinstance(feature, datasets.Value):
        return feature.dtype == "bool" or feature.dtype.startswith(("int", "uint", "float"))
    return type(feature).__name__ in ("List", "Sequence", "LargeList")


def _same_column_twice(chosen: Columns) -> list[str]:
    seen: dict[str, str] = {}
    problems = []
    for role, name in chosen.items():
        if name is not None and name in seen:
            problems.append(f"{SETTINGS[role]}: column {name!r} is also the {ROLE_NAMES[seen[name]]} column")
        elif name is not None:
            seen[name] = role
    return problems


def check_present(part: Part, chosen: Columns) -> list[str]:
    """Problems for columns found in the training data but absent from ``part`` (the eval data)."""
    columns = part.ds.column_names
    return [
        not_found(part.where, name, f"the {ROLE_NAMES[role]} column of the training data", columns)
        for role, name in chosen.items() if name is not None and name not in columns
    ]


def check_text_types(part: Part, chosen: Columns) -> tuple[list[str], list[str]]:
    """(warnings, problems): numbers in a text column are used as text; lists or objects are a problem."""
    warnings, problems = [], []
    for role in ("text", "text_pair"):
        name = chosen[role]
        if name is None or name not in part.ds.column_names or is_text(part.ds.features[name]):
            continue
        feature = part.ds.features[name]
        if isinstance(feature, datasets.Value):
            warnings.append(f"{part.where}: {ROLE_NAMES[role]} column {name!r} holds {feature.dtype} values, "
                            "not strings; they are used as text")
        else:
            problems.append(f"{part.where}: {ROLE_NAMES[role]} column {name!r} holds {_describe(feature)}, not "
                            "text; set " + SETTINGS[role] + " to a column of strings")
    return warnings, problems


def _describe(feature: object) -> str:
    kind = type(feature).__name__
    return {"Json": "mixed JSON values (e.g. strings and numbers)", "List": "lists", "Sequence": "lists"}.get(
        kind, f"{kind} values")


def canonical(ds: datasets.Dataset, chosen: Columns) -> datasets.Dataset:
    """Only the chosen columns, renamed to text / text_pair / label, texts as strings."""
    roles = {name: role for role, name in chosen.items() if name is not None}
    ds = ds.select_columns(list(roles))
    if any(name != role for name, role in roles.items()):
        ds = ds.rename_columns({name: f"__leantrain_{role}" for name, role in roles.items()})
        ds = ds.rename_columns({f"__leantrain_{role}": role for role in roles.values()})
    for role in ("text", "text_pair"):
        if role in ds.column_names and not is_text(ds.features[role]):
            ds = ds.cast_column(role, datasets.Value("string"))
    return ds
