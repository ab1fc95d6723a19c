"""The data side of supervised fine-tuning: instruction/chat rows (``leantrain.data.lm.instructions``) inside the
causal-LM ``tokens`` data side. ``with_instructions(side)`` wraps a data side so that training data whose columns are an
instruction/chat format is loaded, checked and rendered here (response-only labels, truncation, packing), and any
other data goes to the wrapped side (plain text -> token blocks). The choice is made from the data's columns, per
call, so the engine, the task and predict/eval stay free of branches."""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from typing import Iterator

import datasets

from leantrain.config import DataConfig
from leantrain.data.lm import instructions as ins
from leantrain.data.lm import instruction_formats as formats_
from leantrain.data.lm import masks
from leantrain.data.lm import rendering as rd
from leantrain.data.lm import preference_formats as pf
from leantrain.data.caches import using_cache_dir
from leantrain.data.lm.conversation import EXTRA_COLUMNS, prompt_context
from leantrain.data.lm.prompts import is_prompts, refuse_prompts
from leantrain.data.demo import demo_files
from leantrain.data.sources import Part, SourceError, quiet
from leantrain.data.text_loader import PreparedData, data_error, open_parts, open_rows, source_warnings
from leantrain.errors import DataError

log = logging.getLogger("leantrain")


def _train_part(cfg: DataConfig) -> Part | None:
    """data.train opened, or None (a missing file is the other side's to report)."""
    if cfg.train is None or cfg.text_column is not None:  # data.text_column set: language modelling of that column
        return None
    try:
        return open_parts(cfg, cfg.train, None, [])[0]
    except DataError:
        return None


def refuse_preference(ds, where: str) -> None:  # noqa: ANN001 - a datasets.Dataset
    """Preference data, or a chosen / rejected / label column beside instruction data, is not for supervised
    fine-tuning (it would learn every answer as a good one): a DataError saying what the data is."""
    columns = ds.column_names
    fmt = pf.table_format(ds)
    if fmt == "feedback":
        raise DataError(f"{where}: unpaired feedback data (format {pf.describe(fmt)}): supervised fine-tuning would "
                        "learn every answer, those labelled false too; it trains with model.task=preference (KTO)")
    if fmt is not None:
        raise DataError(f"{where}: preference data (format {pf.describe(fmt)}), not instruction data: it trains with "
                        "model.task=preference (DPO and its variants) or, on a sequence classifier, "
                        "model.task=reward-model")
    extra = [c for c in pf.PREFERENCE_COLUMNS if c in columns]
    if extra and formats_.looks_like_instructions(columns):
        raise DataError(f"{where}: a {extra[0]!r} column beside instruction data (format "
                        f"{formats_.FORMATS[formats_.detect_format(columns)][2]}): supervised fine-tuning would "
                        f"ignore it and learn every answer as a good one; drop the column, or give preference data in "
                        f"one of these "
                        f"formats:", pf.accepted())


def _refuse_part(part: Part | None) -> None:
    if part is not None:
        refuse_preference(part.ds, part.where)
        refuse_prompts(part.ds, part.where)


def with_formats(err: DataError) -> DataError:
    """A data error of the text side about the text column, with the instruction/chat formats it could also be."""
    if not any("data.text_column" in p for p in [str(err.args[0]), *err.problems]):
        return err
    formats = "; ".join(d for *_, d in formats_.FORMATS.values())
    return DataError(str(err.args[0]), [*err.problems, f"or instruction/chat data, in one of these formats: {formats}"])


def _keep(part: Part, fmt: str) -> datasets.Dataset:
    required, optional, _ = formats_.FORMATS[fmt]
    keep = [c for c in (*required, *optional, *EXTRA_COLUMNS) if c in part.ds.column_names]
    with quiet():
        return part.ds.select_columns(keep)


PLACEHOLDER = re.compile(r"\{\{\s*[A-Za-z_][\w.]*\s*\}\}")


def _strings(value) -> Iterator[str]:  # noqa: ANN001 - a row's value: text, or lists / dicts of them (chat turns)
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def placeholder_warning(ds: datasets.Dataset, where: str) -> str | None:
    """A warning when rows hold ``{{name}}``-style placeholders (identity data of other tools, filled in by their
    scripts): left as they are, the model learns the braces. None when no row has one."""
    rows, names = 0, {}
    for row in ds:
        found = [m.group(0) for text in _strings(row) for m in PLACEHOLDER.finditer(text)]
        rows += bool(found)
        for f in found:
            names[f] = names.get(f, 0) + 1
    if not rows:
        return None
    shown = ", ".join(f"{n} ({k}x)" for n, k in sorted(names.items(), key=lambda x: -x[1])[:5])
    return (f"{where}: {rows} of {len(ds)} rows hold template placeholders ({shown}{', ...' if len(names) > 5 else ''})"
            "; they are trained literally: replace them with the values they stand for before training")


def load_and_validate(cfg: DataConfig, *, seed: int, batch_size: int,
                      known_labels=None) -> PreparedData:  # noqa: ANN001
    """Instruction/chat training (and eval) rows, checked: one DataError naming file, line and problem."""
    notes: list[str] = []
    train_spec = cfg.train if cfg.train is not None else str(demo_files()[0])
    train, evaluation = open_parts(cfg, train_spec, cfg.eval, notes)
    problems: list[str] = []
    parts = [p for p in (train, evaluation) if p is not None]
    fmts = {}
    for part in parts:
        _refuse_part(part)
        fmt = formats_.detect_format(part.ds.column_names)
        if fmt is None:
            found = ", ".join(part.ds.column_names)
            problems.append(f"{part.where}: not instruction/chat data; columns found: {found}")
            continue
        fmts[id(part)] = fmt
        problems += formats_.check_rows(part.ds, fmt, part.where, name_row=lambda i, p=part: p.rows([i]))
    if problems:
        accepted = "; ".join(d for *_, d in formats_.FORMATS.values())
        raise data_error(problems, [f"instruction/chat formats accepted: {accepted}"])
    if cfg.template not in ("auto", "chat", "plain"):
        rd.check_template(cfg.template)
    fmt = fmts[id(train)]
    notes.append(f"data: instruction/chat rows, format {formats_.FORMATS[fmt][2]}")
    train_ds = _keep(train, fmt)
    eval_ds = _keep(evaluation, fmts[id(evaluation)]) if evaluation is not None else None
    if eval_ds is None:
        with quiet():
            split = train_ds.train_test_split(test_size=cfg.eval_fraction, seed=seed)
        train_ds, eval_ds = split["train"], split["test"]
        notes.append(f"eval data: none given, so {len(eval_ds)} of {len(train.ds)} training rows "
                     f"({cfg.eval_fraction:.0%}) are held out (seed {seed}; set data.eval to use your own)")
    for what, n, name in (("training", cfg.max_train_samples, "train"), ("eval", cfg.max_eval_samples, "eval")):
        ds = train_ds if name == "train" else eval_ds
        if n is not None and len(ds) > n:
            notes.append(f"data.max_{name}_samples: using the first {n} of {len(ds)} {what} rows")
            ds = ds.select(range(n))
            train_ds, eval_ds = (ds, eval_ds) if name == "train" else (train_ds, ds)
    warnings = source_warnings(parts) + [w for p in parts if (w := placeholder_warning(p.ds, p.where))]
    for part in parts:
        blank = formats_.blank_responses(part.ds, fmts[id(part)])
        if blank:
            warnings.append(f"{part.where}: {len(blank)} of {len(part.ds)} examples have an empty response "
                            f"({part.rows(blank)}): the model learns to answer them with nothing; fill them in or "
                            "drop them")
    if len(train_ds) < batch_size:
        warnings.append(f"only {len(train_ds)} training examples, fewer than one batch (train.batch_size={batch_size})")
    return PreparedData(train_ds, eval_ds, [], {"format": fmt}, notes, warnings,
                        rendered=functools.partial(rendered_rows, train, fmt, cfg))


def rendered_rows(part: Part, fmt: str, cfg: DataConfig, tokenizer, n: int) -> list[masks.RenderedRow]:  # noqa: ANN001
    """The first ``n`` rows of ``part`` as training renders them, each named by its file and line; a row that cannot
    be rendered carries why (a template that fails or rewrites earlier turns)."""
    from jinja2 import TemplateError

    rendering = rd.choose_rendering(tokenizer, cfg.template, fmt)
    out = []
    for i in range(min(n, len(part.ds))):
        where = (part.where, part.rows([i]))
        try:
            ids, mask = ins.render_row(part.ds[i], fmt, tokenizer, rendering, cfg.system_prompt,
                                       cfg.train_on_empty_think)
        except (TemplateError, DataError, ValueError) as e:
            out.append(masks.unrendered(*where, rendering, e))
            continue
        everything = cfg.train_on_prompt  # every token is learnt: nothing to check
        out.append(masks.RenderedRow(*where, rendering, ids, [True] * len(ids) if everything else mask,
                                     kind="all" if everything else "response"))
    return out


def load_rows(path: str, cfg: DataConfig, *, require_labels: bool = True, known_labels=None):  # noqa: ANN001
    """One instruction/chat source for ``eval``: (rows, notes)."""
    part = open_rows(path, cfg)
    fmt = formats_.detect_format(part.ds.column_names)
    if fmt is None:
        raise formats_.unknown_format(part.where, part.ds.column_names)
    problems = formats_.check_rows(part.ds, fmt, part.where, name_row=lambda i: part.rows([i]))
    if problems:
        raise data_error(problems)
    return _keep(part, fmt), [f"data: instruction/chat rows, format {formats_.FORMATS[fmt][2]}"]


def packing_on(cfg: DataConfig) -> bool:
    """data.packing: true / false, or auto = on: a packed block's per-example losses equal the examples run alone
    (tests/unit/data/lm/test_sft_packing.py), the loss is normalised by target tokens either way, and packing only
    removes padding."""
    return cfg.packing is not False


def process(dataset: datasets.Dataset, tokenizer, cfg: DataConfig, desc: str = "Rendering") -> datasets.Dataset:
    """Instruction/chat rows -> rows of input_ids, labels (-100 outside the responses unless data.train_on_prompt),
    length, targets, and position_ids when packed. Logs the format, one rendered example with the trained spans in
    [[...]], truncation and packing."""
    size = cfg.block_size
    where = {"Processing train": "data.train", "Processing eval": "data.eval"}.get(desc, "data")
    data = ins.process(dataset, tokenizer, block_size=size, template=cfg.template,
                       train_on_prompt=cfg.train_on_prompt, where=where, desc=desc,
                       system_prompt=cfg.system_prompt, keep_empty_think=cfg.train_on_empty_think)
    for note in data.notes:
        log.info(note)
    if len(data.dataset) and where != "data.eval":
        log.info("rendered example (trained spans in [[...]]):\n%s", ins.show_example(data.dataset[0], tokenizer))
    if not packing_on(cfg):
        return data.dataset
    packed = ins.pack(data.dataset, size)
    log.info(packed.note(size))
    return packed.dataset


@dataclasses.dataclass
class Prompts:
    """Prompts as the model was trained to see them, for ``generation.continuations(model, tokenizer, texts,
    **context())``: ``texts`` (the plain template already applied where the run used it), ``chat`` (True / False /
    None: the tokenizer's chat template where it has one) and, for the chat template, the system text and the tool
    schemas it reads (``tools``)."""

    texts: list[str]
    chat: bool | None
    system: str | None = None
    tools: list[dict] | None = None

    def context(self) -> dict:
        return {"chat": self.chat, "system": self.system, "tools": self.tools}


def sample_inputs(prompts: list[str], tokenizer, cfg: DataConfig, columns: dict | None,  # noqa: ANN001
                  tools: list[dict] | None = None) -> Prompts:
    """``report.sample_prompts`` / ``leantrain generate``'s prompts rendered as training rendered a row of the run's
    data (``columns``: its format), with ``data.system_prompt`` and ``tools`` (function schemas) as training puts
    them: each prompt one user turn. Instruction data with the chat template: chat=True with the system text and
    tools; with the plain template: each prompt wrapped in it (the system text and tools inside), chat=False;
    prompt/completion rows: the prompts as they are, chat=False (training renders no system text there);
    preference data as its prompts were rendered (``columns["prompt"]``: text as prompt/completion rows, messages
    as chat rows). Plain text (no instruction format): chat=None (the generation default: the chat template where the
    tokenizer has one), with the system prompt and tools for that template."""
    fmt = (columns or {}).get("format")
    if fmt in pf.FORMATS:  # preference data: prompts rendered as prompt / completion texts or as chat messages
        fmt = "prompt_completion" if columns.get("prompt") == "text" else "messages"
    if fmt not in formats_.FORMATS:
        chat = bool(getattr(tokenizer, "chat_template", None))
        return Prompts(list(prompts), None, *prompt_context(tokenizer, cfg.system_prompt, tools, chat))
    rendering = rd.choose_rendering(tokenizer, cfg.template, fmt)
    if rendering.mode == "raw":
        return Prompts(list(prompts), False)
    system, tools = prompt_context(tokenizer, cfg.system_prompt, tools, rendering.chat)
    if rendering.mode == "plain":
        template = rendering.template or rd.PLAIN_TEMPLATE
        return Prompts([rd.plain_prompt(p, template, system or "") for p in prompts], False)
    return Prompts(list(prompts), True, system, tools)


def with_instructions(side):  # noqa: ANN001, ANN201 - a leantrain.data.modalities.Modality
    """``side`` (the causal-LM ``tokens`` data side), with instruction/chat data handled here."""

    def load_and_validate_(cfg: DataConfig, **kw):
        train = _train_part(cfg)
        _refuse_part(train)
        if train is not None and formats_.looks_like_instructions(train.ds.column_names):
            with using_cache_dir(cfg.cache_dir):
                return load_and_validate(cfg, **kw)
        try:
            return side.load_and_validate(cfg, **kw)
        except DataError as e:
            raise with_formats(e) from None

    def load_rows_(path: str, cfg: DataConfig, **kw):
        try:
            part = open_rows(path, cfg)
        except (DataError, SourceError):
            part = None
        if part is not None and cfg.text_column is None:
            _refuse_part(part)
        if part is not None and cfg.text_column is None and formats_.looks_like_instructions(part.ds.column_names):
            return load_rows(path, cfg, **kw)
        return side.load_rows(path, cfg, **kw)

    def process_(dataset, processor, cfg: DataConfig, desc: str = "Processing"):  # noqa: ANN001
        if (isinstance(dataset, datasets.Dataset) and cfg.text_column is None
                and formats_.looks_like_instructions(dataset.column_names)):
            return process(dataset, processor, cfg, desc)
        return side.process(dataset, processor, cfg, desc)

    def label_kind_(cfg: DataConfig) -> str:  # model.task=auto: preference data makes a causal LM a preference task,
        train = _train_part(cfg)  # prompts alone a GRPO one
        if train is not None and is_prompts(train.ds.column_names):
            return "prompts"
        return "pairs" if train is not None and is_preference(train) else side.label_kind(cfg)

    return dataclasses.replace(side, load_and_validate=load_and_validate_, load_rows=load_rows_, process=process_,
                               label_kind=label_kind_)


def is_preference(part: Part) -> bool:
    """Whether an opened part is preference data (pairs or unpaired feedback)."""
    return pf.table_format(part.ds) is not None
