"""``leantrain eval`` of a causal language model: ``eval.loss`` (the mean cross-entropy over every target token of
``data.eval``) and ``eval.perplexity``, computed exactly as a training run's evaluation computes them (the same
data side, blocks of the run's ``data.block_size``, the task's per-row sums and counts); of a preference-tuned
policy, its rewards on pairs against the reference it recorded (``eval.reward_accuracy``, ``eval.reward_margin``,
...); of a reward model, its pairwise ``eval.accuracy``."""

from __future__ import annotations

import logging

from leantrain.config import Config
from leantrain.data.loaders import eval_loader
from leantrain.engine.accelerator import has_accelerator, setup_logging
from leantrain.engine.evaluate import evaluate
from leantrain.engine.preflight import check_max_length, check_weights
from leantrain.engine.efficiency import ACCELERATE_PRECISION
from leantrain.engine.run_settings import eval_precision, with_run_settings
from leantrain.engine.training_data import data_side
from leantrain.modeling import load_processor, load_trained_model
from leantrain.modeling.chunked_loss import apply_chunked_loss
from leantrain.modeling.names import resolve_model_name
from leantrain.modeling.tasks import get_task
from leantrain.report.logs import write_json

log = logging.getLogger("leantrain")


def evaluate_language_model(model_dir: str, task: str, cfg: Config, output_path: str | None,
                            batch_size: int = 64) -> dict:
    """{"model", "data", "block_size", "precision", "eval": {"loss", "perplexity", "samples", "tokens"}}; written
    to ``output_path`` (rank 0). Computed in the run's precision unless efficiency.precision is set here."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    mcfg = cfg.model.model_copy(update={"name": model_dir, "config": None, "config_type": None})
    cfg = with_run_settings(model_dir, cfg, None)  # the run's data.block_size unless set here
    cfg = check_max_length(cfg.model_copy(update={"model": mcfg}))  # data.block_size within the model's positions
    AcceleratorState._reset_state()  # a training run earlier in this process must not leave its autocast behind
    precision, why = eval_precision(model_dir, cfg)  # the run's own, so that both report the same loss
    accelerator = Accelerator(cpu=not has_accelerator(), mixed_precision=ACCELERATE_PRECISION[precision])
    setup_logging(accelerator.is_main_process)
    log.info(why)
    check_weights(model_dir, mcfg.allow_pickle)
    model = load_trained_model(model_dir, task, mcfg)
    chunked = apply_chunked_loss(model, cfg.efficiency.chunked_loss)  # per-token losses, no [B, T, V] logits
    if chunked:
        log.info(chunked)
    tokenizer = load_processor(mcfg, task)
    side = data_side(task)
    split, notes = side.load_rows(cfg.data.eval, cfg.data, require_labels=False, known_labels=None)
    for n in notes:
        log.info(n)
    blocks = side.process(split, tokenizer, cfg.data, desc="Processing eval")
    collator = side.collator(tokenizer, cfg.data, train=False, device_type=accelerator.device.type)
    configured = get_task(task).configured(cfg, model.config)  # preference: the recorded method, beta, reference
    reference = configured.reference_model_name()
    if reference:  # against the reference the policy was tuned from, frozen
        log.info("reference: %s", reference)
        folder = resolve_model_name(reference, None)  # a short name (smollm2-135m) or a folder
        check_weights(folder, mcfg.allow_pickle)
        configured = configured.with_reference(load_trained_model(folder, task, mcfg.model_copy(
            update={"name": folder})).to(accelerator.device), accelerator.autocast)  # the policy's precision
    model, loader = accelerator.prepare(model, eval_loader(blocks, batch_size, collator))
    metrics = evaluate(model, loader, accelerator, 0, configured, [])
    result = {"model": model_dir, "data": cfg.data.eval, "block_size": cfg.data.block_size, "precision": precision,
              "eval": metrics}
    if accelerator.is_main_process and output_path:
        write_json(output_path, result)
    return result
