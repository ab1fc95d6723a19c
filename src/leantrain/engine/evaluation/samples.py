"""Sample continuations during training (``report.sample_prompts``, causal LMs): before the first step and at each
evaluation, the greedy continuation (``report.sample_max_new_tokens`` tokens) of each prompt, rendered as training
renders a user turn (``leantrain.data.lm.sft.sample_inputs``: the run's template and ``data.system_prompt``),
written to metrics.jsonl as ``{"type": "samples", "step": n, "samples": [{"prompt", "continuation"}]}`` and shown
in the log.

Every process generates (the same prompts, greedy, so the same number of forward calls on every rank): under FSDP
each forward all-gathers the shards, a collective that needs all ranks; under DDP the unwrapped module runs no
collective and the work is repeated, which costs a few forward passes of a handful of prompts. Rank 0 alone writes
and logs. The model is put in eval mode for the generation and back in its training mode after it.
"""

from __future__ import annotations

import logging

from leantrain.data.lm.sft import sample_inputs
from leantrain.errors import ConfigError
from leantrain.modeling.generation.continuations import continuations
from leantrain.modeling.generation.prompts import check_room, prompt_lengths, prompt_texts
from leantrain.methods import Task
from leantrain.modeling.positions import model_position_limit

log = logging.getLogger("leantrain")


def check_sample_prompts(cfg, task: Task) -> None:  # noqa: ANN001 - leantrain Config
    """``report.sample_prompts`` needs a model that generates text, and prompts that are not empty (exit 2)."""
    prompts = cfg.report.sample_prompts
    if not prompts:
        return
    task.evaluation.check_generates("report.sample_prompts")
    empty = [i for i, p in enumerate(prompts) if not p.strip()]
    if empty:
        raise ConfigError(f"report.sample_prompts[{empty[0]}] is empty: give each prompt some text")


def check_sample_room(cfg, data) -> None:  # noqa: ANN001 - leantrain Config, TrainingData
    """With the run's ``data`` (its tokenizer), each of ``report.sample_prompts`` plus
    ``report.sample_max_new_tokens`` must fit the model's positions (exit 2, before the model loads)."""
    prompts = cfg.report.sample_prompts
    if prompts and data.processor is not None:  # the prompts as generation sees them, and their room
        rendered = sample_inputs(prompts, data.processor, cfg.data, data.columns)
        texts, templated = prompt_texts(data.processor, rendered.texts, **rendered.context())
        check_room(prompt_lengths(data.processor, texts, templated), cfg.report.sample_max_new_tokens,
                   model_position_limit(cfg), "report.sample_max_new_tokens")


def write_samples(model, accelerator, data, step: int, metrics_log, progress=None) -> list[dict] | None:  # noqa: ANN001
    """Generate the run's sample continuations (every rank: see the module docstring); rank 0 writes them to
    metrics.jsonl and the log. None when the run has no sample prompts."""
    cfg = data.config
    prompts = list(cfg.report.sample_prompts) if cfg is not None else []
    if not prompts:
        return None
    inner = accelerator.unwrap_model(model)  # eval mode for the call, back to training after (continuations)
    rendered = sample_inputs(prompts, data.processor, cfg.data, data.columns)  # as trained: template, system prompt
    texts = continuations(inner, data.processor, rendered.texts, max_new_tokens=cfg.report.sample_max_new_tokens,
                          **rendered.context())
    samples = [{"prompt": p, "continuation": t} for p, t in zip(prompts, texts)]
    metrics_log.write({"type": "samples", "step": step, "samples": samples})  # a file on rank 0 only
    if accelerator.is_main_process:
        lines = [f"sample @ step {step}: {s['prompt']!r} -> {s['continuation']!r}" for s in samples]
        for line in lines:
            if progress is not None:
                progress.write(line)
            else:
                log.info(line)
    return samples
