"""The training run, readable in one sitting: set up, loop over optimizer steps, evaluate, save, summarise."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import record_function

from leantrain.config import Config, parse_stop_when
from leantrain.errors import ConfigError
from leantrain.engine.artifacts import save_outputs
from leantrain.engine.best import BestModel
from leantrain.engine.checkpoint import Checkpointer, data_fingerprint, kill_hook
from leantrain.engine.distributed import (CommStats, apply_fsdp, count_fsdp_traffic, distributed_summary, local_sgd,
                                          replica_spread, strategy_name, time_allreduce)
from leantrain.engine.dropout import resolve_dropout
from leantrain.engine.efficiency import (ACCELERATE_PRECISION, apply_model_switches, compile_model, compile_seconds,
                                         resolve_precision)
from leantrain.engine.evaluate import evaluate
from leantrain.engine.faults import FaultInjector
from leantrain.engine.hostmem import host_memory
from leantrain.engine.inputs import prepare_inputs
from leantrain.engine.nonfinite import NonFiniteGuard
from leantrain.engine.resume import apply_rng, decide, prior_records, restore
from leantrain.engine.setup import (attach_trackers, default_output_dir, device_type, make_accelerator, setup_logging,
                                    step_plan)
from leantrain.engine.step import train_step
from leantrain.data.loaders import epoch_plan, train_loader
from leantrain.modeling import build_model, parameter_counts
from leantrain.optim import build_optimizer, build_scheduler, state_report
from leantrain.optim.state import describe as describe_optim_state
from leantrain.perf.flops import MfuMeter
from leantrain.perf.meter import PhaseClock, Throughput
from leantrain.perf.plan import auto_micro_batch
from leantrain.perf.profile import StepProfiler
from leantrain.report.logs import MetricsLog, write_json
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
    with host_memory(cfg.efficiency.cpu_allocator) as allocator:
        return _train(cfg, allocator)


def _train(cfg: Config, allocator: str) -> dict:
    from accelerate.utils import set_seed

    t_start = time.perf_counter()
    precision, why = resolve_precision(cfg.efficiency.precision, device_type())
    accelerator = make_accelerator(cfg, None, ACCELERATE_PRECISION[precision])
    setup_logging(accelerator.is_main_process)
    log.info("precision: %s (%s)", precision, why)
    if allocator == "reuse":
        log.info("host memory: freed buffers stay in the process for the next step (efficiency.cpu_allocator)")
    out = _output_dir(cfg, accelerator)
    cfg = cfg.model_copy(update={"output_dir": str(out)})
    accelerator.project_configuration.set_directories(str(out))
    decision = decide(cfg, out, accelerator)
    if decision.kind == "complete":
        return decision.summary
    set_seed(cfg.train.seed)

    inputs = prepare_inputs(cfg, accelerator)
    plan = step_plan(cfg, len(inputs.train), accelerator.num_processes)
    if cfg.train.micro_batch_size != "auto":  # with auto, the batch line comes once the micro-batch is chosen
        for note in plan.notes:
            log.info(note)

    set_seed(cfg.train.seed)  # the new head's initialisation depends on the seed alone
    model = build_model(cfg.model, inputs.label_names, inputs.task)
    counts = parameter_counts(model)
    log.info("model: %s (%s), %.1fM parameters (%.1fM trainable)", inputs.model_name, type(model).__name__,
             counts["total"] / 1e6, counts["trainable"] / 1e6)
    notes = apply_model_switches(model, cfg.efficiency, accelerator.device.type)
    if cfg.train.micro_batch_size == "auto":
        plan = step_plan(cfg, len(inputs.train), accelerator.num_processes,
                         auto_micro_batch(cfg, model, inputs, accelerator, plan))
        notes += plan.notes
    notes += compile_model(model, cfg.efficiency)
    for note in notes:
        log.info(note)
    model.train()
    model, optimizer, scheduler, eval_dl, comm = _prepare(cfg, accelerator, model, plan, inputs)
    attach_trackers(cfg, accelerator, out)

    ckpt = Checkpointer(cfg, accelerator, out, plan, data_fingerprint(inputs.train))
    state = restore(decision, cfg, accelerator, plan, ckpt.fingerprint, model, optimizer, scheduler)
    metrics_log = MetricsLog(out / "metrics.jsonl" if accelerator.is_main_process else None, accelerator,
                             prior=prior_records(out, state) if accelerator.is_main_process else None)
    meter = Throughput(skip=cfg.train.warmup_steps_excluded)
    mean_tokens = float(np.mean(inputs.token_lengths)) if inputs.token_lengths is not None else 0.0
    flops = MfuMeter(accelerator.unwrap_model(model).config, counts["non_embedding"], mean_tokens,
                     accelerator.device, precision, accelerator.num_processes)  # MFU is for token models only
    loop = Loop(cfg, accelerator, model, optimizer, scheduler, eval_dl, inputs, plan, metrics_log, meter, ckpt, state,
                flops)
    apply_rng(state, cfg, accelerator)
    profiler = StepProfiler(cfg.efficiency.profile, out / "profile", active=cfg.efficiency.profile_steps,
                            is_main=accelerator.is_main_process)
    with local_sgd(accelerator, model, cfg.distributed.local_sgd_steps, comm) as lsgd, profiler:
        loop.run(lsgd, profiler)
    step = loop.step

    loop.guard.check()
    last_eval = loop.last_eval
    if loop.eval_step != step:
        last_eval = _evaluate(model, eval_dl, accelerator, inputs, step, metrics_log, None, meter)
        loop.best.update(last_eval, step, model)
    if cfg.checkpoint.save_model == "best":
        last_eval = loop.best.load_into(model) or last_eval
    summary = save_outputs(
        cfg, accelerator, model, inputs, counts=counts, meter=meter, plan=plan, last_eval=last_eval,
        records=metrics_log.records, wall_seconds=time.perf_counter() - t_start,
        distributed=distributed_summary(cfg, accelerator, model, comm, meter), optim_state=loop.optim_state,
        extra_train={**flops.summary(meter.tokens_per_second), "time_split_seconds": loop.clock.summary()},
        efficiency={**cfg.efficiency.model_dump(), "precision_requested": cfg.efficiency.precision,
                    "precision": precision, "precision_reason": why, "cpu_allocator_applied": allocator,
                    "dropout_applied": resolve_dropout(cfg.efficiency.dropout, accelerator.device.type),
                    "attn_implementation": accelerator.unwrap_model(model).config._attn_implementation,
                    "compile_seconds": compile_seconds() if cfg.efficiency.compile else None},
        extra={"train": {"steps": step, "epochs": round(step / plan.steps_per_epoch, 4),
                         "resumed_from_step": state.step if state.resumed_from else None,
                         "skipped_steps": loop.guard.skipped},
               "best": loop.best.summary()},
    )
    summary["checkpoints"] = ckpt.finish()
    if accelerator.is_main_process:
        write_json(out / "summary.json", summary)
    accelerator.end_training()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # else gloo aborts at exit under torchrun
    return summary


def _prepare(cfg, accelerator, model, plan, inputs):
    """Model, optimizer, schedule and eval data placed and wrapped for the strategy (DDP via Accelerate's
    prepare; FSDP2 shards before the optimizer is built, so the optimizer state is sharded too)."""
    strategy = strategy_name(cfg, accelerator.num_processes)
    comm = CommStats()
    if strategy == "fsdp":
        model = apply_fsdp(model, accelerator)
        count_fsdp_traffic(model, comm)
    optimizer = build_optimizer(model, cfg.optim, cfg.train.lr)
    scheduler = build_scheduler(optimizer, cfg.optim, plan.total_steps)
    eval_dl = inputs.eval_loader(plan.micro_batch_size)
    if strategy == "fsdp":
        optimizer, scheduler, eval_dl = accelerator.prepare(optimizer, scheduler, eval_dl)
    else:
        model, optimizer, scheduler, eval_dl = accelerator.prepare(model, optimizer, scheduler, eval_dl)
    if strategy == "ddp":
        time_allreduce(model, comm)
    return model, optimizer, scheduler, eval_dl, comm


def _eval_due(every: int, step: int, plan) -> bool:
    """Every N steps, or at each epoch's end when N is 0; the final evaluation is made after the loop."""
    if step >= plan.total_steps:
        return False
    return step % (every or plan.steps_per_epoch) == 0


def _log_step(accelerator, model, running, count, grad_norm, lr, meter, step, epoch) -> dict:
    """The one place the step's device values reach the host (a logging step)."""
    loss = accelerator.reduce(running.clone(), reduction="sum").item() / max(count, 1)
    rec = {"type": "train", "step": step, "epoch": round(epoch, 4), "loss": loss,
           "lr": float(lr),
           "samples_per_second": meter.samples_per_second, "tokens_per_second": meter.tokens_per_second}
    if grad_norm is not None:
        rec["grad_norm"] = float(grad_norm)
    spread = replica_spread(model, accelerator)
    if spread is not None:
        rec["replica_spread"] = spread
    return rec


def _target_met(stop_when: str | None, metrics: dict) -> bool:
    if not stop_when or not metrics:
        return False
    key, op, value = parse_stop_when(stop_when)
    if key not in metrics:
        raise ConfigError(f"train.stop_when: no metric {key!r}; evaluation gives {sorted(metrics)}")
    return metrics[key] >= value if op == ">=" else metrics[key] <= value


def _evaluate(model, eval_dl, accelerator, inputs, step, metrics_log, progress, meter) -> dict:
    metrics = evaluate(model, eval_dl, accelerator, len(inputs.label_names))
    record = {"type": "eval", "step": step, "loop_seconds": meter.all_time, **{f"eval.{k}": v for k, v in metrics.items()}}
    metrics_log.write(record)
    text = "eval @ step %d: %s" % (step, " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if k != "samples"))
    if progress is not None:
        progress.write(text)
    else:
        log.info(text)
    return metrics


class Loop:
    """The epoch / step iteration with its running state (step, epoch, loss accumulated on device), resumed from
    ``state`` (a fresh start or a checkpoint), with checkpoints, the best model and the non-finite guard."""

    def __init__(self, cfg, accelerator, model, optimizer, scheduler, eval_dl, inputs, plan, metrics_log, meter,
                 ckpt, state, flops):
        self.cfg, self.accelerator, self.model = cfg, accelerator, model
        self.optimizer, self.scheduler, self.eval_dl = optimizer, scheduler, eval_dl
        self.inputs, self.plan, self.metrics_log, self.meter = inputs, plan, metrics_log, meter
        self.ckpt, self.state, self.flops = ckpt, state, flops
        self.clock = PhaseClock()
        self.host_is_device = accelerator.device.type == "cpu"  # compute/optimizer split without any device sync
        self.lengths = np.asarray(inputs.train["length"])
        self.step, self.epoch = state.step, state.epoch
        self.last_eval, self.eval_step = state.last_eval, state.eval_step
        self.running, self.running_count, self.grad_norm = state.running, state.running_count, None
        self.guard = NonFiniteGuard(cfg, accelerator, Path(cfg.output_dir), self.lengths, plan,
                                    lambda: ckpt.last or state.resumed_from)
        self.step_optimizer = self.guard.optimizer(optimizer)
        self.guard.save_diagnostic = lambda last: ckpt.save_diagnostic(last, model, optimizer, scheduler)
        self.best = BestModel(cfg, accelerator, Path(cfg.output_dir), inputs.tokenizer, state.best)
        self.faults = FaultInjector(accelerator.process_index)
        self.stopped = False
        self.optim_state = None
        self.progress = Progress(plan.total_steps, enabled=accelerator.is_main_process, mode=cfg.report.progress,
                                 initial=state.step)

    @property
    def done(self) -> bool:
        return self.step >= self.plan.total_steps or self.stopped or self.best.should_stop

    def run(self, lsgd=None, profiler=None) -> None:
        self.profiler = profiler
        while not self.done:
            self.run_epoch(lsgd)
            self.epoch += 1
        self.progress.close()

    def run_epoch(self, lsgd) -> None:
        cfg, plan, acc = self.cfg, self.plan, self.accelerator
        start = self.state.start_step if self.epoch == self.state.epoch else 0
        mb_plan = epoch_plan(self.inputs.train, batch_size=plan.batch_size, seed=cfg.train.seed, epoch=self.epoch,
                             batching=cfg.data.batching, group_size=cfg.data.group_size, drop_last=cfg.data.drop_last,
                             rank=acc.process_index, world_size=plan.world_size, accum=plan.accum, start_step=start)
        batches = iter(train_loader(self.inputs.train, mb_plan, self.inputs.collator,
                                    num_workers=cfg.data.num_workers, pin_memory=acc.device.type == "cuda"))
        for global_batch in mb_plan.batches[start:]:
            if self.done:
                return
            self.meter.start_step()
            self.clock.start()
            with record_function("data"):
                micro = self.guard.inject([_to_device(next(batches), acc.device) for _ in range(plan.accum)],
                                          self.step + 1)
            self.clock.lap("data")
            self.lr = self.scheduler.get_last_lr()[0]  # the rate this step applies (host value, no sync)
            loss_sum, self.grad_norm = train_step(
                self.model, micro, global_count=len(global_batch), accelerator=acc, optimizer=self.step_optimizer,
                scheduler=self.scheduler, max_grad_norm=cfg.train.max_grad_norm,
                on_phase=self.clock.lap if self.host_is_device else None,
            )
            self.guard.observe(self.step + 1, loss_sum, self.grad_norm, self.step_optimizer, self.metrics_log)
            if lsgd is not None:
                lsgd.step()
            self.running += loss_sum
            self.running_count += len(global_batch)
            self.step += 1
            self.meter.end_step(len(global_batch), self.inputs.tokens_in(global_batch))
            self.faults.at_step(self.step)
            if self.profiler is not None:
                self.profiler.step()
            if self.optim_state is None:  # once, after the first step allocated the state (metadata only, no sync)
                self.optim_state = state_report(self.optimizer, cfg.optim.name)
                self.progress.write(describe_optim_state(self.optim_state))
            self.after_step()

    def after_step(self) -> None:
        cfg, step = self.cfg, self.step
        logged = None
        if step % cfg.train.log_every_steps == 0 or step == self.plan.total_steps:
            self.guard.check()
            with record_function("logging"):
                logged = _log_step(self.accelerator, self.model, self.running, self.running_count, self.grad_norm,
                                   self.lr, self.meter, step, epoch=step / self.plan.steps_per_epoch)
            logged["mfu"] = self.flops.of(logged["tokens_per_second"])
            self.metrics_log.write(logged)
            self.running.zero_()
            self.running_count = 0
        self.progress.update(step, {k: logged[k] for k in ("loss", "lr", "samples_per_second")} if logged else None)
        if _eval_due(cfg.train.eval_every_steps, step, self.plan):
            self.last_eval = _evaluate(self.model, self.eval_dl, self.accelerator, self.inputs, step,
                                       self.metrics_log, self.progress, self.meter)
            self.eval_step = step
            self.best.update(self.last_eval, step, self.model)
            self.stopped = _target_met(cfg.train.stop_when, self.last_eval)
            if self.stopped:
                log.info("stopping at step %d: %s", step, cfg.train.stop_when)
        if self.ckpt.due(step):
            self.guard.check()  # a checkpoint is always a finite state
            self.ckpt.save(step, self.model, self.optimizer, self.scheduler, epoch=self.epoch, running=self.running,
                           running_count=self.running_count,
                           extra={"best": self.best.state(), "eval_step": self.eval_step, "last_eval": self.last_eval})
        kill_hook(step)
