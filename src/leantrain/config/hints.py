"""Did-you-mean for unknown config keys: the names other trainers use (Hugging Face TrainingArguments, ...) first,
then a close spelling within the same section, then the same name in another section; when nothing is close, say
there is no such key and point to the key reference instead of guessing."""

from __future__ import annotations

import difflib

DOCS = "docs/config.md (or `leantrain train --help`)"

# What the ecosystem calls a setting -> leantrain's key (or a short instruction where there is no one key).
ALIASES: dict[str, str] = {
    "learning_rate": "train.lr",
    "lr_rate": "train.lr",
    "num_train_epochs": "train.epochs",
    "num_epochs": "train.epochs",
    "epoch": "train.epochs",
    "max_steps": "train.max_steps",
    "per_device_train_batch_size": "train.micro_batch_size",
    "per_gpu_train_batch_size": "train.micro_batch_size",
    "per_device_eval_batch_size": "train.eval_batch_size",
    "train_batch_size": "train.batch_size",
    "global_batch_size": "train.batch_size",
    "gradient_accumulation_steps": "train.batch_size (global) with train.micro_batch_size; the accumulation is "
                                   "batch_size / (micro_batch_size x processes)",
    "accumulation_steps": "train.batch_size (global) with train.micro_batch_size; the accumulation is "
                          "batch_size / (micro_batch_size x processes)",
    "warmup_ratio": "optim.warmup_ratio",
    "warmup_steps": "optim.warmup_steps",
    "weight_decay": "optim.weight_decay",
    "lr_scheduler_type": "optim.scheduler",
    "lr_scheduler": "optim.scheduler",
    "optimizer": "optim.name",
    "optim": "optim.name",
    "adam_beta1": "optim.betas",
    "adam_beta2": "optim.betas",
    "adam_epsilon": "optim.eps",
    "max_seq_length": "data.max_length",
    "max_seq_len": "data.max_length",
    "model_max_length": "data.max_length",
    "max_len": "data.max_length",
    "output_dir": "output_dir",
    "output_path": "output_dir",
    "seed": "train.seed",
    "fp16": "efficiency.precision=fp16",
    "bf16": "efficiency.precision=bf16",
    "mixed_precision": "efficiency.precision",
    "max_grad_norm": "train.max_grad_norm",
    "gradient_clipping": "train.max_grad_norm",
    "eval_steps": "train.eval_every_steps",
    "logging_steps": "train.log_every_steps",
    "save_steps": "checkpoint.every_steps",
    "save_total_limit": "checkpoint.keep",
    "metric_for_best_model": "checkpoint.best_metric",
    "load_best_model_at_end": "checkpoint.save_model=best",
    "resume_from_checkpoint": "checkpoint.resume",
    "gradient_checkpointing": "efficiency.gradient_checkpointing",
    "torch_compile": "efficiency.compile",
    "dataloader_num_workers": "data.num_workers",
    "report_to": "report.trackers",
    "model_name_or_path": "model.name",
    "model_name": "model.name",
    "train_file": "data.train",
    "validation_file": "data.eval",
    "eval_file": "data.eval",
    "text_column_name": "data.text_column",
    "label_column_name": "data.label_column",
    "early_stopping": "train.early_stopping_patience",
    "num_labels": "(nothing: the labels come from the data; data.label_names names integer labels)",
}


def suggest(key: str, valid: list[str]) -> str | None:
    """A hint for the unknown dotted ``key`` among the ``valid`` keys, or None when nothing is close."""
    section, _, rest = key.rpartition(".")
    leaf = key.rsplit(".", 1)[-1]
    if leaf in ALIASES:
        return ALIASES[leaf]
    if leaf.lower() in ALIASES:
        return ALIASES[leaf.lower()]
    top = key.split(".", 1)[0]
    in_section = [k for k in valid if k.split(".", 1)[0] == top and "." in key]
    if in_section:  # a misspelling within a section: compare the part after the section name
        tails = {k.split(".", 1)[1]: k for k in in_section}
        close = difflib.get_close_matches(key.split(".", 1)[1], list(tails), n=1, cutoff=0.75)
        if close:
            return tails[close[0]]
    same_leaf = [k for k in valid if k.rsplit(".", 1)[-1] == leaf]
    if same_leaf:  # a right name in the wrong section: train.weight_decay -> optim.weight_decay
        return same_leaf[0]
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.85)  # e.g. a misspelled section: trian.lr
    if close:
        return close[0]
    close = difflib.get_close_matches(leaf, list(ALIASES), n=1, cutoff=0.85)  # e.g. lerning_rate
    if close:
        return ALIASES[close[0]]
    return None


def describe_unknown(key: str, valid: list[str]) -> str:
    hint = suggest(key, valid)
    if hint is None:
        return f"unknown key {key!r}: there is no such key; every key is listed in {DOCS}"
    if " " in hint:  # an instruction, not a key
        return f"unknown key {key!r} — in leantrain: {hint}"
    return f"unknown key {key!r} — did you mean {hint if '=' in hint else repr(hint)}?"
