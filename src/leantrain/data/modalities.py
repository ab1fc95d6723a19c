"""One data side per task: load + validate, process with the model's processor, collate. The engine picks one
by task and stays free of modality branches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from leantrain.config import DataConfig


@dataclass(frozen=True)
class Modality:
    name: str
    load_and_validate: Callable  # (DataConfig, *, seed, batch_size, known_labels=None) -> PreparedData
    load_rows: Callable  # (path, DataConfig, *, require_labels, known_labels) -> (Dataset, notes)
    process: Callable  # (canonical Dataset, processor, DataConfig, desc) -> Dataset with [labels], length
    collator: Callable  # (processor, DataConfig, *, train, seed, device_type) -> rows -> tensors
    counts_tokens: bool  # `length` counts tokens (tokens/s is reported for text only)


def _text_process(dataset, tokenizer, cfg: DataConfig, desc: str = "Tokenizing"):
    from leantrain.data.text import tokenize

    return tokenize(dataset, tokenizer, cfg.max_length, desc=desc)


def _text_collator(tokenizer, cfg: DataConfig, *, train: bool, seed: int = 0, device_type: str = "cpu"):
    from leantrain.data.loaders import make_collator

    return make_collator(tokenizer, batching=cfg.batching, max_length=cfg.max_length,
                         pad_multiple=8 if device_type == "cuda" else None)


def for_task(task: str) -> Modality:
    from leantrain.tasks import AUDIO, IMAGE, TEXT

    if task == TEXT:
        from leantrain.data.validate import load_and_validate, load_rows

        return Modality("text", load_and_validate, load_rows, _text_process, _text_collator, True)
    if task == IMAGE:
        from leantrain.data import image as m
    elif task == AUDIO:
        from leantrain.data import audio as m
    else:
        raise ValueError(f"unknown task {task!r}")
    return Modality(m.KIND.role, m.load_and_validate, m.load_rows, m.process, m.collator, False)
