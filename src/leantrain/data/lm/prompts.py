"""Prompts to be answered (the ``prompts`` data side: GRPO, ``model.task=grpo``): rows with a ``prompt`` (a text, or a
list of ``{role, content}`` messages: conversational) and any other columns, which the reward functions read by name
(``grpo.rewards``). JSON arrays, JSON lines, CSV and every other source ``data.train`` takes; ``data.eval``, else a
seeded hold-out of ``data.eval_fraction``. ``data.train`` unset: the built-in arithmetic prompts
(``leantrain.data.lm.arithmetic``); ``data.train=builtin:word-problems``: the GSM8K-style word problems
(``leantrain.data.lm.word_problems``), each with its own eval prompts.

DATA CONTRACT (what the GRPO task reads; the names are stable)

Processed rows: ``prompt_input_ids`` (list of int), ``length`` (its tokens), ``prompt`` and the other columns as
loaded. A prompt is rendered as SFT renders the prompt of a row it trains on, up to where the answer begins:
messages through the tokenizer's chat template with the assistant's turn opened (or the plain template's prompt part
when there is none, ``data.system_prompt`` as SFT puts it), a text as it is with the tokenizer's special tokens (a
prompt / completion row's prompt; TRL does not template a text prompt either; ``data.template`` as SFT reads it). A
prompt longer than ``data.max_prompt_length`` tokens (unset: half of ``data.block_size``) keeps its end.

Collated (B rows): ``prompt_input_ids`` (B, P) LEFT-padded with the pad id (EOS when there is none),
``prompt_attention_mask`` (B, P), ``loss_weight`` (B,) float32 (0 for the padding rows that keep ranks in step),
and, not tensors, ``prompt`` (the B prompts as loaded) and ``columns`` (name -> the B rows' values of every other
column).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable

import datasets
import torch

from leantrain.config import DataConfig
from leantrain.data.caches import using_cache_dir
from leantrain.data.lm import arithmetic, calculator_problems, word_problems
from leantrain.data.lm import instruction_formats as formats_
from leantrain.data.lm import masks
from leantrain.data.lm import preference_formats as pf
from leantrain.data.lm import rendering as rd
from leantrain.data.lm.collate import pad_id_of
from leantrain.data.lm.conversation import row_tools, with_system
from leantrain.data.lm.preference import prompt_budget
from leantrain.data.lm.preference_render import last_run, policy_rendering
from leantrain.data.mapped import tokenizer_map
from leantrain.data.sources import Part
from leantrain.data.text_loader import PreparedData, data_error, first_rows, open_parts, open_rows, source_warnings
from leantrain.environments import FALLBACK_FORMAT, call_format
from leantrain.errors import DataError

log = logging.getLogger("leantrain")
PROMPT = "prompt"
ANSWER = "completion"  # distillation: the prompt's answer (off-policy steps train on it)
MESSAGES = "messages"
TOOLS = "tools"  # a row's tool schemas (JSON): rendered for the chat template or into the system message
ANSWERED = ("completion", "response", "output", "chosen", "rejected")  # a column that answers the prompt: other data
NOT_AUTO = (*ANSWERED, "label")  # model.task=auto: a label beside a prompt is feedback or classification data
ROLES = ("system", "user", "assistant", "tool")
FIRST_ROWS = 2  # rows the reward functions are tried on before the model loads (Data.check)
DESCRIPTION = "prompt: a text or a list of {role, content} messages; any other columns are passed to the rewards"


def is_prompts(columns: list[str]) -> bool:
    """Prompt-only data: a ``prompt`` column and none that answers it (a completion, response, chosen / rejected,
    label): what ``model.task=auto`` reads as GRPO data."""
    return PROMPT in columns and not any(c in columns for c in NOT_AUTO) \
        and not formats_.looks_like_instructions(columns)


def refuse_prompts(ds: datasets.Dataset, where: str) -> None:
    """Prompt-only data given to supervised fine-tuning (or language modelling): a DataError saying it is GRPO data
    (there is no answer to learn)."""
    if is_prompts(ds.column_names):
        raise DataError(f"{where}: prompts with no completion ({', '.join(ds.column_names)}): GRPO data, with no "
                        "answer to learn by supervised fine-tuning; it trains with model.task=grpo and reward "
                        "functions (grpo.rewards), or add a completion column for SFT")


def _not_prompts(part: Part, answers: bool = False) -> str | None:
    """What is wrong with a part's columns for this side, or None; ``answers``: a ``completion`` column is read
    (distillation's prompt + completion rows)."""
    columns = part.ds.column_names
    if PROMPT not in columns:
        return f"{part.where}: no {PROMPT!r} column; columns found: {', '.join(columns) or 'none'} ({DESCRIPTION})"
    answered = [c for c in ANSWERED if c in columns and not (answers and c == ANSWER)]
    if answered:
        kind = "preference data (model.task=preference)" if pf.table_format(part.ds) is not None else \
            "instruction data (supervised fine-tuning: model.task=causal-lm)"
        return (f"{part.where}: a {answered[0]!r} column: that is {kind}; GRPO reads prompts only and scores the "
                "model's own answers (drop the column, or rename it if a reward function reads it)")
    return None


def read_prompt(value: Any) -> str | list[dict[str, str]]:
    """A row's prompt checked: a non-empty text, or messages (roles system / user / assistant / tool) that do not
    end with the assistant's turn; raises ValueError saying what is wrong."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{PROMPT!r} is empty")
        return value
    if not isinstance(value, list):
        raise ValueError(f"{PROMPT!r} is {type(value).__name__}, not a text or a list of messages")
    answered = [*value, {"role": "assistant", "content": ""}]  # SFT's checks of a conversation, roles read as SFT does
    messages = formats_.to_messages({"messages": answered}, "messages")[:-1]
    if messages and messages[-1]["role"] == "assistant":
        raise ValueError(f"{PROMPT!r} ends with an assistant turn; a prompt ends with the turn to be answered")
    if not any(m["role"] != "system" and m["content"].strip() for m in messages):
        raise ValueError(f"{PROMPT!r} has no non-empty user turn")
    return messages


def read_completion(value: Any) -> str:
    """A row's completion checked: a non-empty text, or one assistant message (TRL's conversational prompt +
    completion rows); its text. Raises ValueError saying what is wrong."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict) \
            and value[0].get("role") == "assistant":
        value = value[0].get("content")
    if not isinstance(value, str):
        raise ValueError(f"{ANSWER!r} is {type(value).__name__}, not a text or one assistant message")
    if not value.strip():
        raise ValueError(f"{ANSWER!r} is empty")
    return value


def _read_row(row: dict, answers: bool) -> None:
    read_prompt(row[PROMPT])
    row_tools(row)
    if answers and ANSWER in row:
        read_completion(row[ANSWER])


def _checked(parts: list[Part], answers: bool = False) -> None:
    problems = []
    for part in parts:
        wrong = _not_prompts(part, answers)
        problems += [wrong] if wrong else formats_.check_rows(
            part.ds, PROMPT, part.where, name_row=lambda i, p=part: p.rows([i]),
            convert=lambda row, _: _read_row(row, answers))
    if problems:
        raise data_error(problems)


def _split_conversations(parts: list[Part]) -> list[Part]:
    """Parts of ``messages`` rows (a conversation ending with the assistant's turn, TRL's conversational format) as
    ``prompt`` (the turns before) + ``completion`` (the last turn's text) rows; other parts as they are."""
    out = []
    for part in parts:
        columns = part.ds.column_names
        if PROMPT in columns or MESSAGES not in columns:
            out.append(part)
            continue

        def split(row: dict) -> dict:
            turns = list(row[MESSAGES] or [])
            last = turns[-1] if turns else {}
            answered = isinstance(last, dict) and last.get("role") == "assistant"
            return {PROMPT: turns[:-1] if answered else turns, ANSWER: last.get("content") if answered else None}

        ds = part.ds.map(split, remove_columns=[MESSAGES], desc="Splitting conversations")
        missing = [i for i, c in enumerate(ds[ANSWER]) if c is None]
        if missing:
            raise data_error([f"{part.where}: {part.rows(missing)}: the conversation does not end with an assistant "
                              "turn (the completion to learn)"])
        out.append(dataclasses.replace(part, ds=ds))
    return out


BUILT_IN = {"arithmetic": arithmetic, "word-problems": word_problems, "calculator": calculator_problems}  # data.train=builtin:<name>
BUILT_IN_PREFIX = "builtin:"


def built_in_prompts(train_spec: str | None):  # noqa: ANN201 - a module with files() and DESCRIPTION, or None
    """The built-in prompt set ``data.train`` names (``builtin:arithmetic``, ``builtin:word-problems``, ``builtin:calculator``; unset: the
    arithmetic prompts), or None for the user's own files; an unknown name exits 2 naming the choices."""
    if train_spec is None:
        return arithmetic
    if not str(train_spec).startswith(BUILT_IN_PREFIX):
        return None
    name = str(train_spec)[len(BUILT_IN_PREFIX):]
    if name not in BUILT_IN:
        raise data_error([f"data.train={train_spec}: no such built-in prompt set; built in: "
                          f"{', '.join(BUILT_IN_PREFIX + n for n in BUILT_IN)}"])
    return BUILT_IN[name]


def load_and_validate(cfg: DataConfig, *, seed: int, batch_size: int, known_labels=None,  # noqa: ANN001
                      answers: bool = False, opening: Callable[[Part], Part] | None = None) -> PreparedData:
    """Prompt rows (and eval rows), checked: one DataError naming file, line and problem. ``answers``: prompts may
    come with a ``completion`` (or as ``messages`` conversations: the last turn is the completion). ``opening``: each
    part's rows made into prompts first (an environment's opening messages and tools: GRPO's ``grpo.environment``)."""
    notes: list[str] = []
    train_spec, eval_spec = cfg.train, cfg.eval
    built_in = built_in_prompts(train_spec)
    if built_in is not None:
        train_spec, built_in_eval = (str(p) for p in built_in.files())
        eval_spec = eval_spec or built_in_eval
        notes.append(f"data: {built_in.DESCRIPTION} (set data.train to use your own)")
    with using_cache_dir(cfg.cache_dir):
        train, evaluation = open_parts(cfg, train_spec, eval_spec, notes)
    if answers:
        train, evaluation = (_split_conversations([p])[0] if p is not None else None for p in (train, evaluation))
    if opening is not None:
        train, evaluation = (opening(p) if p is not None else None for p in (train, evaluation))
    parts = [p for p in (train, evaluation) if p is not None]
    _checked(parts, answers)
    if cfg.template not in ("auto", "chat", "plain"):
        rd.check_template(cfg.template)
    train_ds, eval_ds = train.ds, evaluation.ds if evaluation is not None else None
    if eval_ds is None:
        try:
            split = train_ds.train_test_split(test_size=cfg.eval_fraction, seed=seed)
        except ValueError as e:
            raise data_error([f"data.eval_fraction={cfg.eval_fraction}: cannot hold out eval prompts from "
                              f"{len(train_ds)} training prompts ({e}); set data.eval"]) from None
        train_ds, eval_ds = split["train"], split["test"]
        notes.append(f"eval data: none given, so {len(eval_ds)} of {len(train.ds)} training prompts "
                     f"({cfg.eval_fraction:.0%}) are held out (seed {seed}; set data.eval to use your own)")
    train_ds = first_rows(train_ds, cfg.max_train_samples, "data.max_train_samples", "training", notes)
    eval_ds = first_rows(eval_ds, cfg.max_eval_samples, "data.max_eval_samples", "eval", notes)
    conversational = not isinstance(train_ds[0][PROMPT], str)
    others = [c for c in train_ds.column_names if c != PROMPT]
    answered = answers and ANSWER in train_ds.column_names
    notes.append(f"data: prompts ({'messages' if conversational else 'texts'})"
                 + (f" with completions, other columns: {', '.join(c for c in others if c != ANSWER) or 'none'}"
                    if answered else f", other columns for the rewards: {', '.join(others) or 'none'}"))
    warnings = source_warnings(parts)
    if len(train_ds) < batch_size:
        warnings.append(f"only {len(train_ds)} training prompts, fewer than one batch (train.batch_size={batch_size})")
    shown = "messages" if conversational else "text"  # how sample prompts are rendered
    columns = {"format": "prompts", "prompt": shown, **({"answered": answered} if answers else {}),
               "first_rows": train_ds.select(range(min(FIRST_ROWS, len(train_ds)))).to_list()}  # the rewards' dry call
    return PreparedData(train_ds, eval_ds, [], columns, notes, warnings,
                        room=functools.partial(too_long, parts, cfg),
                        rendered=functools.partial(rendered_rows, train, cfg))


def too_long(parts: list[Part], cfg: DataConfig, tokenizer: Callable[[], Any], new_tokens: int,
             limit: tuple[int, str], key: str) -> list[str]:
    """The rows of ``parts`` whose prompt, rendered and cut as ``process`` cuts it (``data.max_prompt_length``: it
    keeps its end), leaves no room in the model's ``limit`` (positions, where the number comes from) for ``new_tokens``
    more (``key``): one problem per part naming its lines, the longest prompt's tokens and what to set. Nothing to
    render when the prompt budget and the new tokens fit together (``tokenizer()`` is then never called)."""
    positions, source = limit
    budget = prompt_budget(cfg)
    if budget + new_tokens <= positions:
        return []
    tok, problems = tokenizer(), []
    for part in parts:
        textual = isinstance(part.ds[0][PROMPT], str) if len(part.ds) else True
        rendering = policy_rendering(tok, cfg.template, textual)
        tools = part.ds[TOOLS] if TOOLS in part.ds.column_names else [None] * len(part.ds)
        lengths = [min(len(render_prompt(p, tok, rendering, cfg.system_prompt, t)), budget)
                   for p, t in zip(part.ds[PROMPT], tools)]
        over = [i for i, n in enumerate(lengths) if n + new_tokens > positions]
        if not over:
            continue
        longest = max(lengths[i] for i in over)
        room = positions - longest
        fix = f"{key}={room} or less, or " if room > 0 else ""
        many = f", the longest {longest}" if len(over) > 1 else ""
        problems.append(f"{part.where}: {part.rows(over)}: the prompt is {lengths[over[0]]} tokens as cut (at most "
                        f"{budget}{many}), and with {key}={new_tokens} new tokens it takes more than the model's "
                        f"{positions} positions ({source}); set {fix}data.max_prompt_length="
                        f"{max(1, positions - new_tokens)} or less (a longer prompt keeps its end)")
    return problems


def load_rows(path: str, cfg: DataConfig, *, require_labels: bool = True, known_labels=None,  # noqa: ANN001, ANN201
              answers: bool = False, opening: Callable[[Part], Part] | None = None):
    """One source of prompts for ``eval``: (rows, notes); ``answers``, ``opening`` as ``load_and_validate``'s."""
    part = open_rows(path, cfg)
    if answers:
        part = _split_conversations([part])[0]
    if opening is not None:
        part = opening(part)
    _checked([part], answers)
    return part.ds, [f"data: prompts from {part.name}"]


def detected(rows: datasets.Dataset) -> dict:
    """What ``leantrain eval`` found in its rows: {"eval_format": "prompts"}."""
    return {"eval_format": "prompts"}


def render_prompt(prompt: str | list[dict[str, str]], tokenizer, rendering: rd.Rendering,  # noqa: ANN001
                  system_prompt: str | None = None, tools: Any = None) -> list[int]:
    """A prompt's token ids as SFT renders them before the answer: the conversation with an assistant turn rendered
    by ``rendering.render``, cut where the response mask begins (raw: the text with the special tokens). ``tools``:
    the row's tool schemas (its ``tools`` column), for the chat template, or written into the system message with
    how to call them (``environments.call_format``) where the template does not read them."""
    if rendering.mode == "raw":
        return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else read_prompt(prompt)
    messages = with_system(messages, {}, system_prompt)
    schemas = row_tools({"tools": tools})
    ids, mask = rd.render([*messages, {"role": "assistant", "content": "0"}], tokenizer, rendering, schemas,
                          call_format(FALLBACK_FORMAT) if schemas else "")
    return ids[:_answer_start(mask, rendering, tokenizer)]


def _answer_start(mask: list[bool], rendering: rd.Rendering, tokenizer) -> int:  # noqa: ANN001
    """Where the (last) answer begins in a rendered conversation: the start of the last run of its response mask;
    a DataError when the mask is empty (the prompt cannot be told from the answer)."""
    if not any(mask):
        raise DataError(f"the assistant mask is empty: {rd.describe(rendering, tokenizer)} marks no token of the "
                        f"answer, so the prompt cannot be cut where the answer begins; {masks.FIX_EMPTY}")
    return last_run(mask)[0]


def render_answered(prompt: str | list[dict[str, str]], completion: str, tokenizer, rendering: rd.Rendering,  # noqa: ANN001
                    system_prompt: str | None = None) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) of a prompt and its answer as SFT renders the row and trains on it: the completion
    is the last run of SFT's response mask (the template's end-of-turn or the EOS included), the prompt what comes
    before it."""
    if rendering.mode == "raw":
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else read_prompt(prompt)
        messages = with_system(messages, {}, system_prompt)
    ids, mask = rd.render([*messages, {"role": "assistant", "content": read_completion(completion)}], tokenizer,
                          rendering)
    start, end = _answer_start(mask, rendering, tokenizer), last_run(mask)[1]
    return ids[:start], ids[start:end]


def rendered_rows(part: Part, cfg: DataConfig, tokenizer, n: int) -> list[masks.RenderedRow]:  # noqa: ANN001
    """The first ``n`` rows of ``part`` as the model sees them, named by file and line: a prompt as it is asked
    (nothing trained), a prompt with a completion (distillation) with the completion's tokens trained."""
    from jinja2 import TemplateError

    out = []
    for i in range(min(n, len(part.ds))):
        row, where = part.ds[i], (part.where, part.rows([i]))
        rendering = policy_rendering(tokenizer, cfg.template, isinstance(row[PROMPT], str))
        try:
            if row.get(ANSWER) is not None:
                prompt, answer = render_answered(row[PROMPT], row[ANSWER], tokenizer, rendering, cfg.system_prompt)
                out.append(masks.RenderedRow(*where, rendering, prompt + answer,
                                             [False] * len(prompt) + [True] * len(answer)))
            else:
                ids = render_prompt(row[PROMPT], tokenizer, rendering, cfg.system_prompt, row.get(TOOLS))
                out.append(masks.RenderedRow(*where, rendering, ids, [False] * len(ids), "prompt", kind="prompt"))
        except (TemplateError, DataError, ValueError) as e:
            out.append(masks.unrendered(*where, rendering, e, "prompt"))
    return out


def _encode(batch: dict[str, list], tokenizer, rendering: rd.Rendering, budget: int,  # noqa: ANN001
            system_prompt: str | None) -> dict[str, list]:
    if ANSWER in batch:
        pairs = [render_answered(p, c, tokenizer, rendering, system_prompt)
                 for p, c in zip(batch[PROMPT], batch[ANSWER])]
        ids, answers = [p for p, _ in pairs], {"completion_input_ids": [c for _, c in pairs]}
    else:
        tools = batch.get(TOOLS) or [None] * len(batch[PROMPT])
        ids, answers = [render_prompt(p, tokenizer, rendering, system_prompt, t)
                        for p, t in zip(batch[PROMPT], tools)], {}
    return {"prompt_input_ids": [x[-budget:] for x in ids], "length": [min(len(x), budget) for x in ids],
            "trimmed": [len(x) > budget for x in ids], **answers}


def process(dataset: datasets.Dataset, tokenizer, cfg: DataConfig,  # noqa: ANN001
            desc: str = "Rendering") -> datasets.Dataset:
    """Prompt rows -> the contract's rows (cached by datasets); logs how many prompts kept their end only."""
    where = {"Processing train": "data.train", "Processing eval": "data.eval"}.get(desc, "data")
    textual = isinstance(dataset[0][PROMPT], str) if len(dataset) else True
    rendering = policy_rendering(tokenizer, cfg.template, textual)
    budget = prompt_budget(cfg)
    try:
        out = tokenizer_map(dataset, _encode, {"tokenizer": tokenizer, "rendering": rendering, "budget": budget,
                                               "system_prompt": cfg.system_prompt}, batched=True, batch_size=256,
                            desc=desc)
    except DataError as e:
        raise DataError(f"{where}: {e}") from None
    trimmed = sum(out["trimmed"])
    if trimmed:
        log.info("%s: %d of %d prompts over data.max_prompt_length=%d tokens keep their end", where, trimmed, len(out),
                 budget)
    if len(out) and where != "data.eval":
        log.info("rendered prompt:\n%s", tokenizer.decode(out[0]["prompt_input_ids"]))
    return out.remove_columns("trimmed")


class PromptCollator:
    """Prompt rows -> left-padded ``prompt_input_ids`` / ``prompt_attention_mask``, ``loss_weight``, and the
    prompts and other columns as lists; rows with a completion also right-padded ``completion_ids`` /
    ``completion_mask``."""

    TENSORS = ("prompt_input_ids", "length", "loss_weight", "completion_input_ids")

    def __init__(self, pad_token_id: int):
        self.pad_token_id = int(pad_token_id)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        ids, mask = padded([r["prompt_input_ids"] for r in rows], self.pad_token_id, left=True)
        others = [c for c in rows[0] if c not in self.TENSORS and c != PROMPT]
        out = {"prompt_input_ids": ids, "prompt_attention_mask": mask,
               "loss_weight": torch.tensor([float(r.get("loss_weight", 1.0)) for r in rows], dtype=torch.float32),
               PROMPT: [r[PROMPT] for r in rows], "columns": {c: [r[c] for r in rows] for c in others}}
        if "completion_input_ids" in rows[0]:
            out["completion_ids"], out["completion_mask"] = self.completions([r["completion_input_ids"] for r in rows])
        return out

    def completions(self, answers: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' completions right-padded with the pad id (ids, mask)."""
        return padded(answers, self.pad_token_id)


def padded(rows: list[list[int]], pad_id: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as one batch (ids, mask: 1 on the tokens), padded with ``pad_id`` on the right, or on the left
    (``left``: prompts to be continued); at least one column."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        at = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, at] = torch.as_tensor(r, dtype=torch.long)
        mask[i, at] = 1
    return ids, mask


def collator(tokenizer, cfg: DataConfig, *, train: bool, seed: int = 0,  # noqa: ANN001
             device_type: str = "cpu") -> PromptCollator:
    return PromptCollator(pad_id_of(tokenizer))


def describe(train, evals, labels) -> str:  # noqa: ANN001
    return f"{len(train)} train / {len(evals)} eval prompts"
