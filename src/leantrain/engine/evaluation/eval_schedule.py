"""When the loop evaluates and what follows an evaluation: the metrics record and the sample continuations, the best
model, and ``train.stop_when``."""

from __future__ import annotations

import logging

from leantrain.config import parse_stop_when
from leantrain.engine.devices.batch_layout import BatchLayout
from leantrain.engine.checkpoint.best import BestModel
from leantrain.engine.evaluation.evaluate import evaluate
from leantrain.engine.training.loop_state import LoopState
from leantrain.engine.setup.run_parts import Run
from leantrain.engine.evaluation.samples import write_samples
from leantrain.errors import ConfigError
from leantrain.report.progress import Progress

log = logging.getLogger("leantrain")


def eval_due(every: int, step: int, layout: BatchLayout) -> bool:
    """Every N steps, or at each epoch's end when N is 0; the final evaluation is made after the loop."""
    if step >= layout.total_steps:
        return False
    return step % (every or layout.steps_per_epoch) == 0


def target_met(stop_when: str | None, metrics: dict) -> bool:
    if not stop_when or not metrics:
        return False
    key, op, value = parse_stop_when(stop_when)
    if key not in metrics:
        raise ConfigError(f"train.stop_when: no metric {key!r}; evaluation gives {sorted(metrics)}")
    return metrics[key] >= value if op == ">=" else metrics[key] <= value


def evaluate_and_log(run: Run, step: int, progress: Progress | None = None, stop=None) -> dict | None:
    """One evaluation at ``step``, written to metrics.jsonl with the sample continuations and shown; None when
    ``stop`` ended it early."""
    model, accelerator, data = run.model, run.accelerator, run.data
    metrics = evaluate(model, run.eval_dl, accelerator, len(data.label_names), data.task, data.label_names, stop)
    if metrics is None:
        return None
    record = {"type": "eval", "step": step, "loop_seconds": run.meter.all_time,
              **{f"eval.{k}": v for k, v in metrics.items()}}
    run.metrics_log.write(record)
    write_samples(model, accelerator, data, step, run.metrics_log, progress)  # report.sample_prompts (causal LM)
    text = "eval @ step %d: %s" % (step, " ".join(f"{k}={v:.4f}" for k, v in metrics.items()
                                         if k != "samples" and isinstance(v, float)))
    if progress is not None:
        progress.write(text)
    else:
        log.info(text)
    return metrics


def evaluate_at(run: Run, state: LoopState, best: BestModel, step: int, progress: Progress, stop=None) -> bool:
    """The evaluation due at ``step``, recorded in ``state`` and offered to ``best``; True when it meets
    ``train.stop_when``. ``stop`` (a signal, one process) ends it at the next batch recording nothing: the checkpoint
    keeps the earlier eval_step, and the resumed run makes this evaluation first."""
    metrics = evaluate_and_log(run, step, progress, stop)
    if metrics is None:
        return False
    state.last_eval, state.eval_step = metrics, step
    best.update(metrics, step, run.model)
    met = target_met(run.cfg.train.stop_when, metrics)
    if met:
        log.info("stopping at step %d: %s", step, run.cfg.train.stop_when)
    return met
