"""Validated, tokenised inputs for a run: data checked before the model is loaded, tokenised once (the main
process first; the others read the cache it wrote)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from leantrain.config import Config
from leantrain.data import load_and_validate
from leantrain.data.loaders import eval_loader, make_collator
from leantrain.data.text import TextCollator, tokenize
from leantrain.modeling import load_tokenizer, model_name

log = logging.getLogger("leantrain")


@dataclass
class Inputs:
    train: object  # datasets.Dataset, tokenised
    eval: object
    label_names: list[str]
    tokenizer: object
    collator: TextCollator
    model_name: str
    columns: dict = field(default_factory=dict)
    eval_batch_size: int | None = None
    num_workers: int = 0

    def eval_loader(self, micro_batch_size: int):
        return eval_loader(self.eval, self.eval_batch_size or 2 * micro_batch_size, self.collator,
                           num_workers=self.num_workers)


def validate_data(cfg: Config):
    """Load and check the data (no model, no tokenizer): raises DataError listing every problem."""
    return load_and_validate(cfg.data, seed=cfg.train.seed, batch_size=cfg.train.batch_size)


def prepare_inputs(cfg: Config, accelerator) -> Inputs:
    with accelerator.main_process_first():
        data = validate_data(cfg)
    for note in data.notes:
        log.info(note)
    for warning in data.warnings:
        log.warning("warning: %s", warning)
    name = model_name(cfg.model)
    tokenizer = load_tokenizer(cfg.model)
    with accelerator.main_process_first():
        train = tokenize(data.train, tokenizer, cfg.data.max_length, desc="Tokenizing train")
        evals = tokenize(data.eval, tokenizer, cfg.data.max_length, desc="Tokenizing eval")
    log.info("data: %d train / %d eval rows, %d labels %s", len(train), len(evals), len(data.label_names),
             data.label_names[:10])
    pad_multiple = 8 if accelerator.device.type == "cuda" else None
    collator = make_collator(tokenizer, batching=cfg.data.batching, max_length=cfg.data.max_length,
                             pad_multiple=pad_multiple)
    return Inputs(train, evals, data.label_names, tokenizer, collator, name, data.columns,
                  cfg.train.eval_batch_size, cfg.data.num_workers)
