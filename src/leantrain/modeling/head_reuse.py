"""Continuing from a fine-tuned classifier: its head rows follow the label *names*, not the ids.

A model folder whose config carries ``id2label`` (e.g. ``runs/x/model``) has one classifier row per label. The new
data's ids may mean other things (``data.label_order=first_seen``, renamed or extra labels), so reusing the head
by position would silently swap classes. ``model.reuse_head``:

- ``auto`` (default): rows are mapped by name (reordered; a label the model does not know gets a freshly
  initialised row, and a note says so). When no name matches, the head is re-initialised and a note says why.
- ``always``: rows by position, as a plain ``from_pretrained`` does (warning when the names differ); rows beyond
  the model's label count are fresh.
- ``never``: a freshly initialised head.

The head is found generically: the model's last ``nn.Linear`` whose ``out_features`` is the label count (BERT
``classifier``, RoBERTa ``classifier.out_proj``, GPT-2 / Llama ``score``, ViT ``classifier``, ...). The model is
loaded as it was saved (its own label count, so ``from_pretrained`` needs no ``ignore_mismatched_sizes``), then the
head is rebuilt for the new labels and the config's label maps are replaced.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from leantrain.errors import UserError

log = logging.getLogger("leantrain")


def find_head(model: nn.Module, num_labels: int) -> tuple[str, nn.Linear] | None:
    """(dotted name, module) of the classifier Linear with ``out_features == num_labels``; the last one wins."""
    found = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.out_features == num_labels:
            found = (name, module)
    return found


def row_sources(old: list[str], new: list[str], mode: str) -> tuple[list[int | None], str]:
    """For each new label id, the old row it takes (None: fresh), and what happened, in words."""
    if mode == "never":
        return [None] * len(new), "model.reuse_head=never: the classifier head is re-initialised"
    if mode == "always":
        src = [i if i < len(old) else None for i in range(len(new))]
        note = "model.reuse_head=always: the classifier head rows are reused by position"
        if old[: len(new)] != new[: len(old)] or len(old) != len(new):
            note += (f" although the label names differ (model: {_short(old)}; data: {_short(new)}); "
                     "set model.reuse_head=auto to map them by name")
        fresh = [new[i] for i, s in enumerate(src) if s is None]
        if fresh:
            note += f"; fresh rows for {_short(fresh)}"
        return src, note
    index = {name: i for i, name in enumerate(old)}
    src = [index.get(name) for name in new]
    if all(s is None for s in src):
        note = (f"the classifier head is re-initialised: none of the model's labels ({_short(old)}) occurs in "
                f"the data ({_short(new)})")
        if all(n.isdigit() and int(n) < len(old) for n in new):
            note += ("; if these integers are the model's label ids, set data.label_names to the model's names "
                     "(or model.reuse_head=always)")
        return src, note
    parts = ["the classifier head rows are mapped by label name"]
    if [s for s in src if s is not None] != list(range(len(old))) or len(old) != len(new):
        moved = [n for i, n in enumerate(new) if src[i] is not None and src[i] != i]
        if moved:
            parts.append(f"reordered: {_short(moved)}")
    fresh = [n for n, s in zip(new, src) if s is None]
    if fresh:
        parts.append(f"new labels with freshly initialised rows: {_short(fresh)}")
    dropped = [n for n in old if n not in set(new)]
    if dropped:
        parts.append(f"the model's labels not in the data (rows dropped): {_short(dropped)}")
    return src, "; ".join(parts)


def _short(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def remap_head(model, old: list[str], new: list[str], mode: str = "auto") -> str:
    """Rebuild ``model``'s classifier head (loaded with the ``old`` labels) for the ``new`` labels and log what
    happened (a warning when nothing was kept by name or names were ignored); returns the note.

    Fresh rows are initialised by the model's own ``_init_weights`` (seeded by the caller)."""
    found = find_head(model, len(old))
    if found is None:
        raise UserError(f"cannot find the classifier head of {type(model).__name__} (no Linear layer with "
                        f"{len(old)} outputs); set model.reuse_head=never to start a new head")
    name, head = found
    src, note = row_sources(old, new, mode)
    fresh = nn.Linear(head.in_features, len(new), bias=head.bias is not None,
                      device=head.weight.device, dtype=head.weight.dtype)
    if hasattr(model, "_init_weights"):
        model._init_weights(fresh)
    with torch.no_grad():
        for i, s in enumerate(src):
            if s is not None:
                fresh.weight[i] = head.weight[s]
                if head.bias is not None:
                    fresh.bias[i] = head.bias[s]
    parent_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, attr, fresh)
    model.config.num_labels = len(new)  # resets id2label; the maps follow
    model.config.id2label = {i: n for i, n in enumerate(new)}
    model.config.label2id = {n: i for i, n in enumerate(new)}
    if hasattr(model, "num_labels"):
        model.num_labels = len(new)
    by_name = mode == "auto" and any(s is not None for s in src)
    if by_name:
        log.info("%s", note)
    else:
        log.warning("warning: %s", note)
    return note


def needs_remap(old: list[str] | None, new: list[str], mode: str) -> bool:
    """Whether the saved head must be rebuilt: a fine-tuned model whose labels differ (or reuse_head=never)."""
    return old is not None and (old != new or mode == "never")
