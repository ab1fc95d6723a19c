"""The training run, readable in one sitting: set up, loop over optimizer steps, evaluate, save, summarise."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from leantrain.config import Config
from leantrain.engine.artifacts import save_outputs
from leantrain.engine.evaluate import evaluate
from leantrain.engine.inputs import prepare_inputs
from leantrain.engine.setup import default_output_dir, make_accelerator, setup_logging, step_plan
from leantrain.engine.step import train_step
from leantrain.data.loaders import epoch_plan, train_loader
from leantrain.modeling import build_model, parameter_counts
from leantrain.optim import build_optimizer, build_scheduler
from leantrain.perf.meter import Throughput
from leantrain.report.logs import MetricsLog
from leantrain.report.progress import Progress

log = logging.getLogger("leantrain")


def _output_dir(cfg: Config, accelerator) -> Path:
    """Every rank must agree on the folder: rank 0 names it and broadcasts the name."""
    from accelerate.utils import broadcast_object_list

    name = [cfg.output_dir or default_output_dir()]
    if accelerator.num_processes > 1:
        broadcast_object_list(name, from_process=0)
    out = Path(name[0])
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    return out


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def train(cfg: Config) -> dict:
    """Fine-tune ``cfg.model`` on ``cfg.data``; returns the summary (also written to output_dir/summary.json)."""
    from accelerate.utils import set_seed

    t_start = time.perf_counter()
    accelerator = make_accelerator(cfg, None)
    setup_logging(accelerator.is_main_process)
    out = _output_dir(cfg, accelerator)
    cfg = cfg.model_copy(update={"output_dir": str(out)})
    accelerator.project_configuration.set_directories(str(out))
    set_seed(cfg.train.seed)

    inputs = prepare_inputs(cfg, accelerator)
    plan = step_plan(cfg, len(inputs.train), accelerator.num_processes)
    for note in plan.notes:
        log.info(note)

    set_seed(cfg.train.seed)  # the new head's initialisation depends on the seed alone
    model = build_model(cfg.model, inputs.label_names, inputs.task)
    counts = parameter_counts(model)
    log.info("model: %s (%s), %.1fM parameters (%.1fM trainable)", inputs.model_name, type(model).__name__,
             counts["total"] / 1e6, counts["trainable"] / 1e6)
    model.train()
    optimizer = build_optimizer(model, cfg.optim, cfg.train.lr)
    scheduler = build_scheduler(optimizer, cfg.optim, plan.total_steps)
    eval_dl = inputs.eval_loader(plan.micro_batch_size)
    model, optimizer, scheduler, eval_dl = accelerator.prepare(model, optimizer, scheduler, eval_dl)
    if cfg.report.trackers:
        accelerator.init_trackers("leantrain", config=_flat_scalars(cfg.to_dict()))

    metrics_log = MetricsLog(out / "metrics.jsonl" if accelerator.is_main_process else None, accelerator)
    meter = Throughput(skip=cfg.train.warmup_steps_excluded)
    progress = Progress(plan.total_steps, enabled=accelerator.is_main_process, mode=cfg.report.progress)
    step, epoch, last_eval = 0, 0, {}
    running = torch.zeros((), device=accelerator.device)
    running_count, grad_norm = 0, None
    while step < plan.total_steps:
        mb_plan = epoch_plan(inputs.train, batch_size=plan.batch_size, seed=cfg.train.seed, epoch=epoch,
                             batching=cfg.data.batching, group_size=cfg.data.group_size, drop_last=cfg.data.drop_last,
                             rank=accelerator.process_index, world_size=plan.world_size, accum=plan.accum)
        batches = iter(train_loader(inputs.train, mb_plan, inputs.collator, num_workers=cfg.data.num_workers,
                                    pin_memory=accelerator.device.type == "cuda"))
        for global_batch in mb_plan.batches:
            if step >= plan.total_steps:
                break
            meter.start_step()
            micro = [_to_device(next(batches), accelerator.device) for _ in range(plan.accum)]
            loss_sum, grad_norm = train_step(
                model, micro, global_count=len(global_batch), accelerator=accelerator, optimizer=optimizer,
                scheduler=scheduler, max_grad_norm=cfg.train.max_grad_norm,
            )
            running += loss_sum
            running_count += len(global_batch)
            step += 1
            meter.end_step(len(global_batch), inputs.tokens_in(global_batch))
            logged = None
            if step % cfg.train.log_every_steps == 0 or step == plan.total_steps:
                logged = _log_step(accelerator, running, running_count, grad_norm, scheduler, meter, step,
                                   epoch=step / plan.steps_per_epoch)
                metrics_log.write(logged)
                running.zero_()
                running_count = 0
            progress.update(step, {k: logged[k] for k in ("loss", "lr", "samples_per_second")} if logged else None)
            if _eval_due(cfg.train.eval_every_steps, step, plan):
                last_eval = _evaluate(model, eval_dl, accelerator, inputs, step, metrics_log, progress)
        epoch += 1
    progress.close()

    last_eval = _evaluate(model, eval_dl, accelerator, inputs, step, metrics_log, None)
    summary = save_outputs(
        cfg, accelerator, model, inputs, counts=counts, meter=meter, plan=plan, last_eval=last_eval,
        records=metrics_log.records, wall_seconds=time.perf_counter() - t_start,
    )
    accelerator.end_training()
    return summary


def _eval_due(every: int, step: int, plan) -> bool:
    """Every N steps, or at each epoch's end when N is 0; the final evaluation is made after the loop."""
    if step >= plan.total_steps:
        return False
    return step % (every or plan.steps_per_epoch) == 0


def _log_step(accelerator, running, count, grad_norm, scheduler, meter, step, epoch) -> dict:
    """The one place the step's device values reach the host (a logging step)."""
    loss = accelerator.reduce(running.clone(), reduction="sum").item() / max(count, 1)
    rec = {"type": "train", "step": step, "epoch": round(epoch, 4), "loss": loss,
           "lr": float(scheduler.get_last_lr()[0]),
           "samples_per_second": meter.samples_per_second, "tokens_per_second": meter.tokens_per_second}
    if grad_norm is not None:
        rec["grad_norm"] = float(grad_norm)
    return rec


def _evaluate(model, eval_dl, accelerator, inputs, step, metrics_log, progress) -> dict:
    metrics = evaluate(model, eval_dl, accelerator, len(inputs.label_names))
    record = {"type": "eval", "step": step, **{f"eval.{k}": v for k, v in metrics.items()}}
    metrics_log.write(record)
    text = "eval @ step %d: %s" % (step, " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if k != "samples"))
    if progress is not None:
        progress.write(text)
    else:
        log.info(text)
    return metrics


def _flat_scalars(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat_scalars(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float, str, bool)):
            out[f"{prefix}{k}"] = v
        else:
            out[f"{prefix}{k}"] = str(v)
    return out
