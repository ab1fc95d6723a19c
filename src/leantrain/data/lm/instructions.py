"""Instruction and chat data for supervised fine-tuning of causal LMs: detect the format
(``instruction_formats``), render each conversation with the tokenizer's chat template or a plain template
(``rendering``), label only the tokens the model should learn, and pack several examples into one block.

Rows come out in the causal-LM contract's schema: ``input_ids``, ``labels`` (same length, not shifted, -100 where
there is no target: prompt tokens unless data.train_on_prompt, and always the first token), ``length``, ``targets``
(labels != -100 past the first token: what a shifted loss counts), and ``position_ids`` when packed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import datasets
import numpy as np

from leantrain.data.lm.conversation import row_tools, tools_note
from leantrain.data.lm.instruction_formats import FORMATS, check_rows, detect_format, to_messages, unknown_format
from leantrain.data.lm.masks import marked, without_empty_think
from leantrain.data.lm.rendering import (IGNORE, Rendering, choose_rendering, describe, labelled, render,
                                         template_error)
from leantrain.data.mapped import tokenizer_map
from leantrain.errors import DataError, problems_error


def render_row(row: dict[str, Any], fmt: str, tokenizer, rendering: Rendering, system_prompt: str | None = None,
               keep_empty_think: bool = False) -> tuple[list[int], list[bool]]:
    """(token ids, trained mask) of one row of a detected format: its conversation rendered, without the empty think
    blocks unless ``keep_empty_think`` (``masks.without_empty_think``). Raises the template's errors, DataError
    (a template that rewrites earlier turns) and ValueError (a malformed row)."""
    ids, mask = render(to_messages(row, fmt, system_prompt), tokenizer, rendering, row_tools(row))
    return ids, mask if keep_empty_think else without_empty_think(ids, mask, tokenizer)


def _encode(batch: dict[str, list], indices: list[int], tokenizer, fmt: str, rendering: Rendering,
            train_on_prompt: bool, block_size: int, where: str = "data.train",
            system_prompt: str | None = None, keep_empty_think: bool = False) -> dict[str, list]:
    from jinja2 import TemplateError

    out: dict[str, list] = {"input_ids": [], "labels": [], "length": [], "targets": [], "truncated": []}
    n = len(next(iter(batch.values())))
    for i in range(n):
        row = {k: v[i] for k, v in batch.items()}
        try:
            ids, mask = render_row(row, fmt, tokenizer, rendering, system_prompt, keep_empty_think)
        except TemplateError as e:
            raise template_error(e, tokenizer, f"{where}: row {indices[i] + 1}") from None
        except DataError as e:
            raise DataError(f"{where}: row {indices[i] + 1}: {e}") from None
        one = labelled(ids, mask, train_on_prompt=train_on_prompt, block_size=block_size)
        if one is None:
            one = {"input_ids": ids[:block_size], "labels": [IGNORE] * min(len(ids), block_size),
                   "length": min(len(ids), block_size), "targets": 0, "truncated": len(ids) > block_size}
        for k in out:
            out[k].append(one[k])
    return out


@dataclass
class SftData:
    """The processed rows and what processing found (for the log)."""

    dataset: datasets.Dataset
    format: str
    rendering: Rendering
    truncated: int = 0
    dropped: int = 0
    notes: list[str] = field(default_factory=list)


def process(ds: datasets.Dataset, tokenizer, *, block_size: int, template: str = "auto",
            train_on_prompt: bool = False, where: str = "data.train", desc: str = "Rendering",
            system_prompt: str | None = None, keep_empty_think: bool = False) -> SftData:
    """Rows of an instruction/chat format -> SftData with input_ids, labels, length, targets (cached by datasets);
    ``keep_empty_think``: data.train_on_empty_think."""
    fmt = detect_format(ds.column_names)
    if fmt is None:
        raise unknown_format(where, ds.column_names)
    problems = check_rows(ds, fmt, where)
    if problems:
        raise problems_error(problems)
    rendering = choose_rendering(tokenizer, template, fmt)
    out = tokenizer_map(ds, _encode, {"tokenizer": tokenizer, "fmt": fmt, "rendering": rendering,
                                      "train_on_prompt": train_on_prompt, "block_size": block_size, "where": where,
                                      "system_prompt": system_prompt, "keep_empty_think": keep_empty_think},
                        batched=True, batch_size=256, remove_columns=ds.column_names, desc=desc, with_indices=True)
    truncated = int(np.sum(out.with_format("numpy")["truncated"])) if len(out) else 0
    targets = np.asarray(out["targets"])
    keep = np.flatnonzero(targets > 0)
    dropped = len(out) - len(keep)
    if dropped:
        out = out.select(keep)
    out = out.remove_columns(["truncated"])
    data = SftData(out, fmt, rendering, truncated, dropped)
    data.notes.append(f"{where}: instruction data, format {FORMATS[fmt][2]}; rendered with "
                      f"{describe(rendering)}; loss on {'every token' if train_on_prompt else 'responses only'}")
    if "tools" in ds.column_names:
        data.notes.append(tools_note(where, tokenizer, rendering.chat))
    if dropped and not truncated:
        data.notes.append(f"{where}: {dropped} of {len(ds)} examples with no token to learn (an empty assistant "
                          "mask) were dropped")
    if truncated:
        gone = f"; {dropped} left with no response token were dropped" if dropped else ""
        data.notes.append(f"{where}: {truncated} of {len(ds)} examples longer than data.block_size={block_size} "
                          f"tokens, cut from the end{gone}")
    return data


def show_example(row: dict[str, Any], tokenizer, open_mark: str = "[[", close_mark: str = "]]") -> str:
    """One processed row as text with the trained spans in [[...]] (what the log prints)."""
    return marked(row["input_ids"], [y != IGNORE for y in row["labels"]], tokenizer, open_mark, close_mark)


# ------------------------------------------------------------------------------------------ packing


@dataclass
class Packed:
    dataset: datasets.Dataset
    examples: int
    blocks: int
    padding_before: int  # pad tokens when every example is a row padded to block_size
    padding_after: int  # pad tokens when every block is padded to block_size

    def note(self, block_size: int) -> str:
        saved = self.padding_before - self.padding_after
        tokens = self.blocks * block_size - self.padding_after
        fill = tokens / max(self.blocks * block_size, 1)
        return (f"data.packing: {self.examples} examples packed into {self.blocks} blocks of <= {block_size} tokens "
                f"({self.examples / max(self.blocks, 1):.1f} per block, {fill:.0%} full; positions restart per "
                f"example, no attention across examples); padding saved: {saved:,} tokens against every example "
                f"padded to data.block_size (length-grouped batches of single examples pad less than that)")


def pack_order(lengths: Sequence[int], block_size: int) -> list[list[int]]:
    """First-fit decreasing: groups of example indices whose lengths sum to <= block_size. Deterministic."""
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order.tolist():
        n = int(lengths[i])
        for b, r in enumerate(room):
            if n <= r:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(block_size - n)
    return bins


def pack(ds: datasets.Dataset, block_size: int) -> Packed:
    """Processed SFT rows -> blocks of several examples: input_ids and labels concatenated, position_ids restarting
    at 0 per example (the model's packed-sequence mask keeps attention inside each example), length and targets
    summed. Each example's first label is already -100, so no target crosses an example boundary."""
    cols = ds.with_format(None)[:]
    lengths = cols["length"]
    groups = pack_order(lengths, block_size)
    rows: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": [], "length": [], "targets": []}
    for g in groups:
        ids, labels, pos = [], [], []
        for i in g:
            ids += cols["input_ids"][i]
            labels += cols["labels"][i]
            pos += list(range(lengths[i]))
        rows["input_ids"].append(ids)
        rows["labels"].append(labels)
        rows["position_ids"].append(pos)
        rows["length"].append(len(ids))
        rows["targets"].append(int(sum(cols["targets"][i] for i in g)))
    packed = datasets.Dataset.from_dict(rows)
    before = len(lengths) * block_size - int(np.sum(lengths))
    after = len(groups) * block_size - int(np.sum(lengths))
    return Packed(packed, len(lengths), len(groups), before, after)
