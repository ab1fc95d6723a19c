"""Preference data: pairs (DPO and its variants), unpaired feedback (KTO) and pairs for a reward model, detected from
the columns, checked row by row, rendered as SFT renders (``preference_render``), collated two sequences per row
(``preference_collate``). Formats (``preference_formats.FORMATS``): ``explicit`` prompt / chosen / rejected (texts or
message lists), ``implicit`` chosen / rejected full transcripts (HH-RLHF texts or message lists; the prompt is their
common beginning cut at its last assistant turn), ``sharegpt`` conversations + chosen / rejected turns, ``alpaca``
instruction / input / chosen / rejected, ``feedback`` prompt / completion / label or messages / label.
JSON arrays as well as JSON lines (and every other source ``data.train`` takes).

DATA CONTRACT (what the preference tasks read; the names are stable)

``pairs`` data side (pairs on a causal LM). Processed rows: ``chosen_input_ids``, ``chosen_labels``,
``rejected_input_ids``, ``rejected_labels`` (lists of int; labels = the input ids on response tokens, -100 on the
prompt and the template's text, and on the first token; unshifted, like the causal LM's labels) and ``length`` (the
longer of the two). Each sequence is SFT's rendering; both start with the same prompt tokens (those their
renderings share: a prompt token a tokenizer merges differently into one answer goes with it, unlabelled). Collated (B rows): ``input_ids`` (2B, T), rows
0..B-1 the chosen and B..2B-1 the rejected sequences, right-padded with the pad id; ``attention_mask`` (2B, T);
``labels`` (2B, T), -100 on padding; ``loss_weight`` (B,) (0 for the padding rows that keep ranks in step);
``ref_logps`` (B, 2) float32 (chosen, rejected) when the dataset has the float columns ``ref_chosen_logps`` /
``ref_rejected_logps``. Unit: pairs (count = number of rows).

``feedback`` data side (unpaired, KTO). Rows: ``input_ids``, ``labels`` (as above), ``desirable`` (1 / 0),
``kl_input_ids``, ``kl_labels`` (the row's prompt with the next row's completion, in the split's order, the last row
taking the first's: TRL's KL estimate), ``length``. Collated: ``input_ids`` (2B, T) = the B rows then their B KL
rows, ``attention_mask``, ``labels``, ``loss_weight`` (B,), ``desirable`` (B,) long; ``ref_logps`` (B, 2) (row, KL
row) when the columns ``ref_logps`` / ``ref_kl_logps`` exist.

``scored-pairs`` data side (pairs on a sequence classifier: a reward model). Rows: ``chosen_input_ids``,
``rejected_input_ids`` (prompt + response through the tokenizer's chat template when it has one, else the plain
text, with the tokenizer's special tokens; cut at the tokenizer's ``model_max_length`` too), ``length``. Collated: ``input_ids`` (2B, T), ``attention_mask`` (2B, T),
``loss_weight`` (B,); no labels.

Lengths: a prompt longer than ``data.max_prompt_length`` tokens (unset: half of ``data.block_size``) keeps its end;
a sequence longer than ``data.block_size`` is cut at the end of its response. Pairs whose chosen and rejected are
the same (after that cut) are dropped, as are rows left with no response token; every count is logged.
``table_format(dataset)`` (``detect_format`` of its columns and its label column's values) tells preference data
from other data (None: not preference data).
"""

from __future__ import annotations

import functools
import logging

import datasets
import numpy as np

from leantrain.config import DataConfig
from leantrain.data.lm import instructions as ins
from leantrain.data.lm import rendering as rd
from leantrain.data.lm import preference_formats as pf
from leantrain.data.lm import preference_render as render
from leantrain.data.caches import using_cache_dir
from leantrain.data.lm.collate import pad_id_of
from leantrain.data.lm.preference_collate import FeedbackCollator, PairCollator
from leantrain.data.mapped import tokenizer_map
from leantrain.data.sources import Part, quiet
from leantrain.data.text import pad_multiple
from leantrain.data.text_loader import PreparedData, data_error, open_parts, open_rows, source_warnings
from leantrain.data.text_loader import first_rows
from leantrain.errors import DataError

log = logging.getLogger("leantrain")
SIDES = ("pairs", "feedback", "scored-pairs")
detect_format = pf.detect_format


def prompt_budget(cfg: DataConfig) -> int:
    """data.max_prompt_length, else half of data.block_size."""
    return cfg.max_prompt_length if cfg.max_prompt_length is not None else cfg.block_size // 2


def _part_format(part: Part, side: str) -> tuple[str | None, str | None]:
    """(format, problem) of one part for a data side."""
    columns = part.ds.column_names
    fmt = pf.table_format(part.ds)
    if fmt is None:
        return None, (f"{part.where}: not preference data; columns found: {', '.join(columns) or 'none'}; "
                      f"formats accepted: {'; '.join(pf.accepted())}")
    if (fmt == "feedback") != (side == "feedback"):
        what = "unpaired feedback (prompt / completion / label)" if fmt == "feedback" else "preference pairs"
        wanted = "unpaired feedback" if side == "feedback" else "chosen / rejected pairs"
        return None, f"{part.where}: {what}, but this task reads {wanted}"
    return fmt, None


def _keep(part: Part, fmt: str) -> datasets.Dataset:
    with quiet():
        return part.ds.select_columns(pf.keep_columns(fmt, part.ds.column_names))


def _hold_out(train: datasets.Dataset, fraction: float, seed: int, notes: list[str]):  # noqa: ANN202
    """A seeded hold-out that keeps the file order on both sides (the KL rows pair each row with the next)."""
    n = len(train)
    k = max(1, int(round(n * fraction)))
    if n - k < 1:
        raise data_error([f"data.eval_fraction={fraction}: cannot hold out eval rows from {n} training rows; "
                          "set data.eval"])
    held = np.sort(np.random.default_rng(seed).permutation(n)[:k])
    kept = np.setdiff1d(np.arange(n), held)
    notes.append(f"eval data: none given, so {k} of {n} training rows ({fraction:.0%}) are held out (seed {seed}; "
                 "set data.eval to use your own)")
    return train.select(kept), train.select(held)


def load_and_validate(cfg: DataConfig, *, seed: int, batch_size: int, known_labels=None,  # noqa: ANN001
                      side: str = "pairs") -> PreparedData:
    """Preference training (and eval) rows, checked: one DataError naming file, line and problem."""
    if cfg.train is None:
        raise data_error([f"data.train: preference tuning needs a file of preference data, in one of these formats: "
                          f"{'; '.join(pf.accepted())}"])
    problems = _check_lengths(cfg)
    notes: list[str] = []
    with using_cache_dir(cfg.cache_dir):
        train, evaluation = open_parts(cfg, cfg.train, cfg.eval, notes)
    parts = [p for p in (train, evaluation) if p is not None]
    fmts = {}
    for part in parts:
        fmt, problem = _part_format(part, side)
        if problem:
            problems.append(problem)
            continue
        fmts[id(part)] = fmt
        problems += pf.check_rows(part.ds, fmt, part.where, name_row=lambda i, p=part: p.rows([i]))
    if problems:
        raise data_error(problems)
    fmt = fmts[id(train)]
    notes.append(f"data: preference data, format {pf.describe(fmt)}")
    train_ds = _keep(train, fmt)
    eval_ds = _keep(evaluation, fmts[id(evaluation)]) if evaluation is not None else None
    if eval_ds is None:
        train_ds, eval_ds = _hold_out(train_ds, cfg.eval_fraction, seed, notes)
    train_ds = first_rows(train_ds, cfg.max_train_samples, "data.max_train_samples", "training", notes)
    eval_ds = first_rows(eval_ds, cfg.max_eval_samples, "data.max_eval_samples", "eval", notes)
    warnings = source_warnings(parts)
    if len(train_ds) < batch_size:
        warnings.append(f"only {len(train_ds)} training rows, fewer than one batch (train.batch_size={batch_size})")
    prompt = "text" if pf.to_example(train_ds[0], fmt).textual else "messages"  # how sample prompts are rendered
    rendered = None if side == "scored-pairs" else \
        functools.partial(render.rendered_rows, train, fmt, cfg.template, cfg.train_on_empty_think)
    return PreparedData(train_ds, eval_ds, [], {"format": fmt, "prompt": prompt}, notes, warnings, rendered=rendered)


def _check_lengths(cfg: DataConfig) -> list[str]:
    """data.max_prompt_length leaves room for a response; a custom data.template is well formed."""
    if cfg.template not in ("auto", "chat", "plain"):
        rd.check_template(cfg.template)
    if prompt_budget(cfg) >= cfg.block_size:
        return [f"data.max_prompt_length={cfg.max_prompt_length} leaves no room for a response in "
                f"data.block_size={cfg.block_size} tokens; set it below data.block_size"]
    return []


def load_rows(path: str, cfg: DataConfig, *, require_labels: bool = True, known_labels=None,  # noqa: ANN001
              side: str = "pairs"):  # noqa: ANN201
    """One preference source for ``eval``: (rows, notes)."""
    part = open_rows(path, cfg)
    fmt, problem = _part_format(part, side)
    problems = [problem] if problem else pf.check_rows(part.ds, fmt, part.where, name_row=lambda i: part.rows([i]))
    if problems:
        raise data_error(problems)
    return _keep(part, fmt), [f"data: preference data, format {pf.describe(fmt)}"]


def detected(rows: datasets.Dataset) -> dict:
    """What ``leantrain eval`` found in its rows, as the run's ``columns`` name it for ``Data.check``:
    {"eval_format": the preference format}."""
    return {"eval_format": pf.table_format(rows)}


def process(dataset: datasets.Dataset, tokenizer, cfg: DataConfig, desc: str = "Rendering",  # noqa: ANN001
            side: str = "pairs") -> datasets.Dataset:
    """Rows of a preference format -> the contract's rows of this side (cached by datasets); logs the format, the
    counts and one rendered example with the trained spans in [[...]]."""
    where = {"Processing train": "data.train", "Processing eval": "data.eval"}.get(desc, "data")
    fmt = pf.table_format(dataset)
    if fmt is None:
        raise DataError(f"{where}: not preference data; columns found: {', '.join(dataset.column_names)}")
    budget, cap, n = prompt_budget(cfg), cfg.block_size, len(dataset)
    limit = getattr(tokenizer, "model_max_length", None) or cap
    if side == "scored-pairs" and limit < cap:  # a classifier's position embeddings end there (MiniLM: 512)
        log.info("%s: sequences cut to the tokenizer's model_max_length=%d (below data.block_size=%d)", where, limit,
                 cap)
        cap = limit
    common = {"batched": True, "batch_size": 256, "remove_columns": dataset.column_names, "desc": desc}
    if side == "feedback":
        raw = tokenizer_map(dataset, render.encode_feedback, {"tokenizer": tokenizer, "template": cfg.template,
                                                              "keep_empty_think": cfg.train_on_empty_think}, **common)
        rows, counts = render.feedback_rows(raw["prompt_ids"], raw["completion_ids"], raw["desirable"], budget, cap)
        counts["desirable"] = int(sum(rows["desirable"]))
        out = datasets.Dataset.from_dict(rows)
    else:
        encode = render.encode_pairs if side == "pairs" else render.encode_scored
        kwargs = {"tokenizer": tokenizer, "fmt": fmt, "max_prompt": budget, "cap": cap}
        if side == "pairs":
            kwargs.update(template=cfg.template, keep_empty_think=cfg.train_on_empty_think)
        out = tokenizer_map(dataset, encode, kwargs, **common)
        flags = {k: np.asarray(out[k], dtype=bool) for k in ("trimmed", "cut", "tie", "empty")}
        keep = ~(flags["tie"] | flags["empty"])
        counts = {"tie": int(flags["tie"].sum()), "empty": int((flags["empty"] & ~flags["tie"]).sum()),
                  "trimmed": int(flags["trimmed"][keep].sum()), "cut": int(flags["cut"][keep].sum())}
        out = out.select(np.flatnonzero(keep)) if not keep.all() else out
        out = out.remove_columns(list(flags))
    for note in _notes(where, fmt, side, n, len(out), counts, budget, cap):
        log.info(note)
    if side == "feedback" and len(out) and counts["desirable"] in (0, len(out)):
        _warn_one_label(where, good=bool(counts["desirable"]))
    if len(out) and where != "data.eval":
        log.info("rendered example (trained spans in [[...]]):\n%s", show_example(out[0], tokenizer, side))
    if not len(out):
        raise DataError(f"{where}: no {'rows' if side == 'feedback' else 'pairs'} left to train on after dropping "
                        "those above")
    return out


def _notes(where: str, fmt: str, side: str, n: int, kept: int, counts: dict, budget: int, cap: int) -> list[str]:
    unit = "rows" if side == "feedback" else "pairs"
    notes = [f"{where}: preference data, format {pf.describe(fmt)}: {kept} of {n} {unit} kept"]
    if "desirable" in counts:
        notes.append(f"{where}: {counts['desirable']} desirable, {kept - counts['desirable']} undesirable rows")
    if counts.get("tie"):
        notes.append(f"{where}: {counts['tie']} pairs with chosen == rejected (after the cut below) dropped")
    if counts.get("empty"):
        notes.append(f"{where}: {counts['empty']} {unit} with no response token dropped")
    if counts.get("trimmed"):
        notes.append(f"{where}: {counts['trimmed']} {unit} with a prompt over data.max_prompt_length={budget} tokens: "
                     "the prompt keeps its end")
    if counts.get("cut"):
        notes.append(f"{where}: {counts['cut']} {unit} with a response cut to fit data.block_size={cap} tokens")
    return notes


def _warn_one_label(where: str, good: bool) -> None:
    """Feedback rows that all have one label (``good``: all desirable): KTO learns from one kind of answer only, and
    the metrics of the missing kind are undefined (nan)."""
    missing, metric = ("undesirable", "rejected") if good else ("desirable", "chosen")
    log.warning("warning: %s: no %s rows (every label is %s): eval.%s_reward, eval.%s_logps and eval.reward_margin "
                "are undefined (nan) on it%s", where, missing, str(good).lower(), metric, metric,
                "" if where == "data.eval" else ", and KTO learns from one kind of answer only")


def show_example(row: dict, tokenizer, side: str = "pairs") -> str:  # noqa: ANN001
    """One processed row as text: each sequence with its trained spans in [[...]] (a reward model's: as is)."""
    names = ("", "kl_") if side == "feedback" else ("chosen_", "rejected_")
    titles = (f"{'desirable' if row.get('desirable') else 'undesirable'}", "KL row") if side == "feedback" else \
        ("chosen", "rejected")
    out = []
    for name, title in zip(names, titles):
        ids = row[f"{name}input_ids"]
        labels = row.get(f"{name}labels", [render.IGNORE] * len(ids))
        out.append(f"--- {title}:\n{ins.show_example({'input_ids': ids, 'labels': labels}, tokenizer)}")
    return "\n".join(out)


def collator(tokenizer, cfg: DataConfig, *, train: bool, seed: int = 0, device_type: str = "cpu",  # noqa: ANN001
             side: str = "pairs"):  # noqa: ANN201
    multiple = pad_multiple(device_type)
    if side == "feedback":
        return FeedbackCollator(pad_id_of(tokenizer), multiple_of=multiple)
    return PairCollator(pad_id_of(tokenizer), multiple_of=multiple, labels=side == "pairs")


def side_functions(side: str) -> dict:
    """The data side's functions (a ``leantrain.data.modalities.Modality`` is built from them)."""
    kind = "feedback" if side == "feedback" else "pairs"
    return {"load_and_validate": functools.partial(load_and_validate, side=side),
            "load_rows": functools.partial(load_rows, side=side), "process": functools.partial(process, side=side),
            "collator": functools.partial(collator, side=side), "counts_tokens": True, "detected": detected,
            "label_kind": lambda cfg: kind}


def is_feedback(data, cfg: DataConfig | None = None) -> bool:  # noqa: ANN001
    """Whether ``data`` is unpaired feedback: a dataset (its columns and first row), a file path (with ``cfg``) or a
    DataConfig (its data.train). Data that cannot be opened is not (the pairs side reports it)."""
    if isinstance(data, datasets.Dataset):
        return pf.table_format(data) == "feedback"
    try:
        part = open_rows(data, cfg) if isinstance(data, str) else \
            open_parts(data, data.train, None, [])[0] if data.train is not None else None
    except (DataError, OSError, ValueError):
        return False
    return part is not None and pf.table_format(part.ds) == "feedback"
