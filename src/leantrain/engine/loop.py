"""The training run, readable in one sitting: set up, loop over optimizer steps, evaluate, save, summarise."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, set_seed
from torch import nn
from torch.profiler import record_function
from torch.utils.data import DataLoader

from leantrain.config import Config, parse_stop_when
from leantrain.data.loaders import epoch_micro_batches, train_loader
from leantrain.engine.accelerator import (attach_trackers, default_output_dir, device_type, make_accelerator,
                                          setup_logging)
from leantrain.engine.artifacts import RunResult, efficiency_summary, save_outputs
from leantrain.engine.batch_layout import BatchLayout, batch_layout
from leantrain.engine.checkpoint.best import BestModel
from leantrain.engine.checkpoint.save import Checkpointer, data_fingerprint
from leantrain.engine.distributed import (CommStats, apply_fsdp, count_fsdp_traffic, distributed_summary, local_sgd,
                                          replica_spread, strategy_name, time_allreduce)
from leantrain.engine.efficiency import (ACCELERATE_PRECISION, ModelChoices, apply_model_switches, compile_model,
                                         output_loss_sizes, resolve_model_choices, resolve_precision)
from leantrain.engine.evaluate import evaluate
from leantrain.engine.faults import FaultInjector
from leantrain.engine.host_allocator import host_memory
from leantrain.engine.checkpoint.lock import hold as hold_lock, release as release_lock
from leantrain.engine.nonfinite import NonFiniteGuard
from leantrain.engine.checkpoint.preempt import Preemption
from leantrain.engine.checkpoint.resume import (Decision, LoopState, apply_rng, decide, prior_records, restore,
                                     resume_problems)
from leantrain.engine.run_description import RunDescription, describe_run
from leantrain.engine.samples import check_sample_room, write_samples
from leantrain.engine.step import train_step
from leantrain.engine.training_data import TrainingData, prepare_training_data
from leantrain.errors import ConfigError
from leantrain.modeling import build_model, flop_parameters, parameter_counts
from leantrain.modeling.head_start import head_group
from leantrain.modeling.lora import Trainable, apply_trainable
from leantrain.modeling.qlora import check_qlora_precision, load_kwargs as qlora_load_kwargs
from leantrain.optim import build_optimizer, build_scheduler, state_report
from leantrain.optim.state import describe as describe_optim_state
from leantrain.perf.auto_micro_batch import auto_micro_batch
from leantrain.perf.flops import MfuMeter
from leantrain.perf.meter import PhaseClock, Throughput
from leantrain.perf.profile import StepProfiler
from leantrain.report.logs import MetricsLog, write_json
from leantrain.report.progress import Progress

log = logging.getLogger("leantrain")


def _output_dir(cfg: Config, accelerator: Accelerator) -> Path:
    """Every rank must agree on the folder: rank 0 names it and broadcasts the name."""
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


def train(run: RunDescription | Config) -> dict:
    """Fine-tune the described run (a ``Config``: described and checked here first, ``describe_run``); returns the
    summary (also written to output_dir/summary.json)."""
    run = describe_run(run) if isinstance(run, Config) else run  # every check once, before any work
    with host_memory(run.cfg.efficiency.cpu_allocator, device_type()) as allocator:
        try:
            return _train(run, allocator)
        finally:
            release_lock()


def _train(described: RunDescription, allocator: str) -> dict:
    """Set up, run, finish."""
    t_start = time.perf_counter()
    start = start_run(described.cfg, allocator)
    if start.decision.kind == "complete":
        return start.decision.summary
    run = build_run(start, described)
    loop = Loop(run.parts)
    run_loop(loop, run)
    return finish(loop, run, wall_seconds=time.perf_counter() - t_start)


@dataclass
class RunStart:
    """The run before any data or model: its config (with the agreed output folder), Accelerator, precision and
    the resume decision."""

    cfg: Config
    accelerator: Accelerator
    out: Path
    decision: Decision
    precision: str
    precision_reason: str
    allocator: str


@dataclass
class LoopParts:
    """Everything the loop works with, built by ``build_run``."""

    cfg: Config
    accelerator: Accelerator
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    eval_dl: DataLoader
    data: TrainingData
    layout: BatchLayout
    metrics_log: MetricsLog
    meter: Throughput
    ckpt: Checkpointer
    state: LoopState
    flops: MfuMeter
    faults: FaultInjector


@dataclass
class Run:
    """A set-up run: what the loop uses, and what the summary needs besides the loop's own results."""

    start: RunStart
    parts: LoopParts
    counts: dict[str, int]
    comm: CommStats
    choices: ModelChoices
    trainable: Trainable | None = None


def start_run(cfg: Config, allocator: str) -> RunStart:
    """Precision, the Accelerator, logging, the run folder (agreed by all ranks) and the resume decision."""
    precision, why = resolve_precision(cfg.efficiency.precision, device_type())
    check_qlora_precision(cfg, precision)  # peft.method=qlora computes in bf16; before any model
    accelerator = make_accelerator(cfg, None, ACCELERATE_PRECISION[precision])
    setup_logging(accelerator.is_main_process)
    log.info("precision: %s (%s)", precision, why)
    if allocator == "reuse":
        log.info("host memory: freed buffers stay in the process for the next step (efficiency.cpu_allocator)")
    out = _output_dir(cfg, accelerator)
    hold_lock(out, accelerator)  # one run per output_dir (exit 2 naming the other run's pid)
    cfg = cfg.model_copy(update={"output_dir": str(out)})
    accelerator.project_configuration.set_directories(str(out))
    decision = decide(cfg, out, accelerator)
    return RunStart(cfg, accelerator, out, decision, precision, why, allocator)


def build_run(start: RunStart, described: RunDescription) -> Run:
    """Data (as ``described``), batch layout, model (with its switches, the automatic micro-batch, compilation),
    optimizer, schedule, trackers, checkpointer, the restored state and the meters."""
    cfg, accelerator, out = start.cfg, start.accelerator, start.out
    set_seed(cfg.train.seed)
    data = prepare_training_data(cfg, accelerator, described)
    check_sample_room(cfg, data)  # report.sample_prompts: their room in the model's positions, with its tokenizer
    layout = batch_layout(cfg, len(data.train), accelerator.num_processes)
    if cfg.train.micro_batch_size != "auto":  # with auto, the batch line comes once the micro-batch is chosen
        for note in layout.notes:
            log.info(note)

    resume_problems(start.decision, cfg, accelerator, layout, data_fingerprint(data.train))  # refused: no model yet
    set_seed(cfg.train.seed)  # the new head's initialisation depends on the seed alone
    choices = resolve_model_choices(cfg, data.task, accelerator.device.type, start.precision)  # attention, compile
    model = build_model(cfg.model, data.label_names, data.task, attention=choices.attention,  # qlora: 4-bit here
                        extra=qlora_load_kwargs(cfg.peft.method, accelerator.local_process_index))
    model.config.update(data.task_object.saved_config(None))  # e.g. the target standardisation, saved with it
    if note := data.task_object.start_head(model):  # multi-label: a fresh head's bias at the labels' prior
        log.info("%s", note)
    model, trainable = apply_trainable(model, cfg.model, cfg.peft,  # LoRA (peft.*) and model.freeze
                                       gradient_checkpointing=cfg.efficiency.gradient_checkpointing)
    counts = parameter_counts(model)
    log.info("model: %s (%s), %.1fM parameters (%.1fM trainable)", data.model_name, type(model).__name__,
             counts["total"] / 1e6, counts["trainable"] / 1e6)
    micro = "auto" if cfg.train.micro_batch_size == "auto" else layout.micro_batch_size
    sizes = output_loss_sizes(model, cfg.efficiency, accelerator.device, micro, cfg.data.block_size)
    notes = [choices.attention_note(model), *apply_model_switches(
        model, cfg.efficiency, accelerator.device.type, *sizes, uniform=data.task_object.uniform_token_gradients)]
    data.bind_model(model, accelerator, cfg.train.eval_batch_size or 8)  # e.g. reference log-probs, before any resume
    if cfg.train.micro_batch_size == "auto":
        layout = batch_layout(cfg, len(data.train), accelerator.num_processes,
                              auto_micro_batch(cfg, model, data, accelerator, layout, start.precision))
        notes += layout.notes
    notes += compile_model(model, choices)
    for note in notes:
        log.info(note)
    model.train()
    model, optimizer, scheduler, eval_dl, comm = _prepare(cfg, accelerator, model, layout, data)
    attach_trackers(cfg, accelerator, out)

    faults = FaultInjector(accelerator.process_index)
    ckpt = Checkpointer(cfg, accelerator, out, layout, data_fingerprint(data.train), faults)
    state = restore(start.decision, cfg, accelerator, layout, ckpt.fingerprint, model, optimizer, scheduler)
    metrics_log = MetricsLog(out / "metrics.jsonl" if accelerator.is_main_process else None, accelerator,
                             prior=prior_records(out, state) if accelerator.is_main_process else None)
    meter = Throughput(skip=cfg.train.warmup_steps_excluded)
    mean_tokens = float(np.mean(data.token_lengths)) if data.token_lengths is not None else 0.0
    inner = accelerator.unwrap_model(model)
    flops = MfuMeter(inner.config, flop_parameters(inner, counts), mean_tokens,
                     accelerator.device, start.precision, accelerator.num_processes)  # MFU is for token models only
    parts = LoopParts(cfg, accelerator, model, optimizer, scheduler, eval_dl, data, layout, metrics_log, meter, ckpt,
                      state, flops, faults)
    return Run(start, parts, counts, comm, choices, trainable)


def run_loop(loop: Loop, run: Run) -> None:
    """The optimizer steps, with the restored RNG, the profiler and local SGD around them."""
    p = run.parts
    if p.state.step == 0:  # report.sample_prompts: the continuations before training, to compare with
        write_samples(p.model, p.accelerator, p.data, 0, p.metrics_log)
    apply_rng(p.state, p.cfg, p.accelerator)
    profiler = StepProfiler(p.cfg.efficiency.profile, run.start.out / "profile", active=p.cfg.efficiency.profile_steps,
                            is_main=p.accelerator.is_main_process)
    with local_sgd(p.accelerator, p.model, p.cfg.distributed.local_sgd_steps, run.comm) as lsgd, profiler:
        loop.run(lsgd, profiler)


def finish(loop: Loop, run: Run, *, wall_seconds: float) -> dict:
    """The final evaluation (unless the last step had one), the best model back in place, the outputs saved."""
    p, start = run.parts, run.start
    cfg, accelerator, model = p.cfg, p.accelerator, p.model
    loop.guard.check()
    last_eval = loop.last_eval
    if loop.eval_step != loop.step:
        last_eval = _evaluate(model, p.eval_dl, accelerator, p.data, loop.step, p.metrics_log, None, p.meter)
        loop.best.update(last_eval, loop.step, model)
    if cfg.checkpoint.save_model == "best":
        last_eval = loop.best.load_into(model) or last_eval
    result = RunResult(
        layout=p.layout, meter=p.meter, steps=loop.step, last_eval=last_eval, records=p.metrics_log.records,
        wall_seconds=wall_seconds, counts=run.counts, optim_state=loop.optim_state,
        speed={**p.flops.summary(p.meter.tokens_per_second), "time_split_seconds": loop.clock.summary()},
        efficiency=efficiency_summary(cfg.efficiency, accelerator, model, start.precision, start.precision_reason,
                                      start.allocator, run.choices),
        distributed=distributed_summary(cfg, accelerator, model, run.comm, p.meter),
        resumed_from_step=p.state.step if p.state.resumed_from else None, skipped_steps=loop.guard.skipped,
        best=loop.best.summary(), trainable=run.trainable.record(cfg.peft) if run.trainable else None,
    )
    summary = save_outputs(cfg, accelerator, model, p.data, result)
    summary["checkpoints"] = p.ckpt.finish()  # only now, with model/ and summary.json written, are they spare
    if accelerator.is_main_process:
        write_json(Path(cfg.output_dir) / "summary.json", summary)
    accelerator.end_training()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # else gloo aborts at exit under torchrun
    return summary


def _prepare(cfg: Config, accelerator: Accelerator, model: nn.Module, layout: BatchLayout, data: TrainingData):
    """Model, optimizer, schedule and eval data placed and wrapped for the strategy (DDP via Accelerate's
    prepare; FSDP2 shards before the optimizer is built, so the optimizer state is sharded too)."""
    strategy = strategy_name(cfg, accelerator.num_processes)
    comm = CommStats()
    if strategy == "fsdp":
        model = apply_fsdp(model, accelerator)
        count_fsdp_traffic(model, comm)
    head, head_lr = head_group(model, len(data.label_names), cfg.train.lr, cfg.train.head_lr,
                               data.task_object.head_lr_factor)
    if head:
        log.info("classifier head: its own learning rate %.3g (%s; the rest %.3g)", head_lr, "train.head_lr" if
                 cfg.train.head_lr is not None else f"{data.task.name}'s default, train.head_lr to change", cfg.train.lr)
    optimizer = build_optimizer(model, cfg.optim, cfg.train.lr, head, head_lr)
    scheduler = build_scheduler(optimizer, cfg.optim, layout.total_steps)
    eval_dl = data.eval_loader(layout.micro_batch_size)
    if strategy == "fsdp":
        optimizer, scheduler, eval_dl = accelerator.prepare(optimizer, scheduler, eval_dl)
    else:
        model, optimizer, scheduler, eval_dl = accelerator.prepare(model, optimizer, scheduler, eval_dl)
    if strategy == "ddp":
        time_allreduce(model, comm)
    return model, optimizer, scheduler, eval_dl, comm


def _eval_due(every: int, step: int, layout: BatchLayout) -> bool:
    """Every N steps, or at each epoch's end when N is 0; the final evaluation is made after the loop."""
    if step >= layout.total_steps:
        return False
    return step % (every or layout.steps_per_epoch) == 0


def _log_step(accelerator, model, running, count, grad_norm, lr, meter, step, epoch) -> dict:
    """The one place the step's device values reach the host (a logging step)."""
    loss = accelerator.reduce(running.clone(), reduction="sum").item() / (count if count > 0 else 1)  # a float
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


def _evaluate(model: nn.Module, eval_dl: DataLoader, accelerator: Accelerator, data: TrainingData, step: int,
              metrics_log: MetricsLog, progress: Progress | None, meter: Throughput, stop=None) -> dict | None:
    metrics = evaluate(model, eval_dl, accelerator, len(data.label_names), data.task_object, data.label_names, stop)
    if metrics is None:
        return None
    record = {"type": "eval", "step": step, "loop_seconds": meter.all_time, **{f"eval.{k}": v for k, v in metrics.items()}}
    metrics_log.write(record)
    write_samples(model, accelerator, data, step, metrics_log, progress)  # report.sample_prompts (causal LM)
    text = "eval @ step %d: %s" % (step, " ".join(f"{k}={v:.4f}" for k, v in metrics.items()
                                         if k != "samples" and isinstance(v, float)))
    if progress is not None:
        progress.write(text)
    else:
        log.info(text)
    return metrics


class Loop:
    """The epoch / step iteration with its running state (step, epoch, loss accumulated on device), resumed from
    ``parts.state`` (a fresh start or a checkpoint), with checkpoints, the best model and the non-finite guard."""

    def __init__(self, parts: LoopParts):
        p = parts
        self.cfg, self.accelerator, self.model = p.cfg, p.accelerator, p.model
        self.optimizer, self.scheduler, self.eval_dl = p.optimizer, p.scheduler, p.eval_dl
        self.data, self.layout, self.metrics_log, self.meter = p.data, p.layout, p.metrics_log, p.meter
        self.ckpt, self.state, self.flops, self.faults = p.ckpt, p.state, p.flops, p.faults
        self.clock = PhaseClock()
        self.host_is_device = p.accelerator.device.type == "cpu"  # compute/optimizer split without any device sync
        self.lengths = np.asarray(p.data.train["length"])
        self.step, self.epoch = p.state.step, p.state.epoch
        self.last_eval, self.eval_step = p.state.last_eval, p.state.eval_step
        self.running, self.running_count, self.grad_norm = p.state.running, p.state.running_count, None
        self.guard = NonFiniteGuard(p.cfg, p.accelerator, Path(p.cfg.output_dir), self.lengths, p.layout,
                                    lambda: p.ckpt.last or p.state.resumed_from)
        self.step_optimizer = self.guard.optimizer(p.optimizer)
        self.guard.save_diagnostic = lambda last: p.ckpt.save_diagnostic(last, p.model, p.optimizer, p.scheduler)
        self.best = BestModel(p.cfg, p.accelerator, Path(p.cfg.output_dir), p.data.processor, p.state.best)
        self.preempt = Preemption(p.accelerator, p.layout, p.cfg.train.log_every_steps, p.ckpt.due)
        self.stopped = False
        self.optim_state: dict | None = None
        self.profiler: StepProfiler | None = None
        self.progress = Progress(p.layout.total_steps, enabled=p.accelerator.is_main_process,
                                 mode=p.cfg.report.progress, initial=p.state.step)

    @property
    def done(self) -> bool:
        return self.step >= self.layout.total_steps or self.stopped or self.best.should_stop

    def run(self, lsgd=None, profiler: StepProfiler | None = None) -> None:
        self.profiler = profiler
        self.preempt.install()
        try:
            if self.state.resumed_from and self.eval_step != self.step and _eval_due(
                    self.cfg.train.eval_every_steps, self.step, self.layout):
                self.evaluate_at(self.step)  # stopped by a signal before the checkpoint: made now
            while not self.done:
                self.run_epoch(lsgd)
                self.epoch += 1
        finally:
            self.preempt.uninstall()
        self.progress.close()

    def run_epoch(self, lsgd) -> None:
        cfg, layout, acc = self.cfg, self.layout, self.accelerator
        start = self.state.start_step if self.epoch == self.state.epoch else 0
        micro_batches = epoch_micro_batches(
            self.data.train, batch_size=layout.batch_size, seed=cfg.train.seed, epoch=self.epoch,
            batching=cfg.data.batching, group_size=cfg.data.group_size, drop_last=cfg.data.drop_last,
            rank=acc.process_index, world_size=layout.world_size, accum=layout.accum, start_step=start)
        batches = iter(train_loader(self.data.train, micro_batches, self.data.collator,
                                    num_workers=cfg.data.num_workers, pin_memory=acc.device.type == "cuda"))
        for global_batch in micro_batches.batches[start:]:
            if self.done:
                return
            self.meter.start_step()
            self.clock.start()
            with record_function("data"):
                micro = self.faults.poison([_to_device(next(batches), acc.device) for _ in range(layout.accum)],
                                           self.step + 1)
            self.clock.lap("data")
            self.lr = self.scheduler.get_last_lr()[0]  # the rate this step applies (host value, no sync)
            units = self.data.units_in(global_batch)  # the loss's denominator, the task's unit, known on the host
            loss_sum, self.grad_norm = train_step(
                self.model, micro, global_count=units, task=self.data.task_object,
                accelerator=acc, optimizer=self.step_optimizer,
                scheduler=self.scheduler, max_grad_norm=cfg.train.max_grad_norm,
                guard=functools.partial(self.guard.before_update, self.step + 1),
                on_phase=self.clock.lap if self.host_is_device else None,
            )
            self.guard.after_update(self.step + 1, self.step_optimizer, self.metrics_log)
            if lsgd is not None:
                lsgd.step()
            self.running += loss_sum
            self.running_count += units
            self.step += 1
            self.meter.end_step(len(global_batch), self.data.tokens_in(global_batch))
            self.faults.after_update(self.step)
            if self.profiler is not None:
                self.profiler.step()
            if self.optim_state is None:  # once, after the first step allocated the state (metadata only, no sync)
                self.optim_state = state_report(self.optimizer, cfg.optim.name)
                self.progress.write(describe_optim_state(self.optim_state))
            self.after_step()
            self.faults.signal_after(self.step)
            if (stop := self.preempt.stop_signal(self.step)) is not None:  # a signal: checkpoint, then stop
                path = self.checkpoint_now()
                self.progress.close()
                self.preempt.stop(stop, self.step, path)

    def after_step(self) -> None:
        cfg, step = self.cfg, self.step
        logged = None
        if step % cfg.train.log_every_steps == 0 or step == self.layout.total_steps:
            self.guard.check()
            with record_function("logging"):
                logged = _log_step(self.accelerator, self.model, self.running, self.running_count, self.grad_norm,
                                   self.lr, self.meter, step, epoch=step / self.layout.steps_per_epoch)
            logged["mfu"] = self.flops.of(logged["tokens_per_second"])
            self.metrics_log.write(logged)
            self.running.zero_()
            self.running_count = 0
        speed = "tokens_per_second" if self.data.task_object.unit == "tokens" else "samples_per_second"
        self.progress.update(step, {k: logged[k] for k in ("loss", "lr", speed)} if logged else None)
        if _eval_due(cfg.train.eval_every_steps, step, self.layout):
            self.evaluate_at(step)
        if self.ckpt.due(step):
            self.save_checkpoint()
        self.faults.after_step(step)

    def evaluate_at(self, step: int) -> None:
        """The evaluation due at ``step``; one process stops it at the next batch on a signal, recording nothing
        (the checkpoint keeps the earlier eval_step: the resumed run makes it first); several processes finish it."""
        stop = (lambda: self.preempt.signum != 0) if self.accelerator.num_processes == 1 else None
        metrics = _evaluate(self.model, self.eval_dl, self.accelerator, self.data, step, self.metrics_log,
                            self.progress, self.meter, stop)
        if metrics is None:
            return
        self.last_eval, self.eval_step = metrics, step
        self.best.update(metrics, step, self.model)
        self.stopped = _target_met(self.cfg.train.stop_when, metrics)
        if self.stopped:
            log.info("stopping at step %d: %s", step, self.cfg.train.stop_when)

    def checkpoint_now(self) -> Path:
        """The checkpoint of this step: the one just saved, else a new one."""
        last = self.ckpt.last
        return last if last is not None and last.name.endswith(f"{self.step:07d}") else self.save_checkpoint()

    def save_checkpoint(self) -> Path:
        self.guard.check()  # a checkpoint is always a finite state
        return self.ckpt.save(self.step, self.model, self.optimizer, self.scheduler, epoch=self.epoch,
                              running=self.running, running_count=self.running_count,
                              extra={"best": self.best.state(), "eval_step": self.eval_step,
                                     "last_eval": self.last_eval})
