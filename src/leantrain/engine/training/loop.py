"""The training run, readable in one sitting: set up, loop over optimizer steps, evaluate, save, summarise.

Each global step: the micro-batches loaded, the method's batches made from them (``Task.step.batches``: as loaded by
default; the loss's denominator a host count, or a device count summed over the processes once), its updates (one
optimizer step each, ``engine/training/step.py``; one by default), the record of a logging step (the loss and the method's step
metrics, reduced over the processes only there), then the evaluation and the checkpoint due at any of its steps: a
method's several updates on one batch are never split by a checkpoint, and ``state.step`` counts optimizer steps while
``state.batches`` (the step less ``state.extra_updates``) keeps the position in the data for a resume."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, set_seed
from torch.profiler import record_function

from leantrain.config import Config
from leantrain.data.loaders import epoch_micro_batches, to_device, train_loader
from leantrain.engine.devices.accelerator import (attach_trackers, default_output_dir, device_type, end_processes,
                                          make_accelerator, setup_logging)
from leantrain.engine.artifacts import RunResult, efficiency_summary, save_outputs
from leantrain.engine.devices.batch_layout import batch_layout
from leantrain.engine.checkpoint.best import BestModel
from leantrain.engine.checkpoint.lock import hold as hold_lock, release as release_lock
from leantrain.engine.checkpoint.preempt import Preemption
from leantrain.engine.checkpoint.resume import decide, prior_records, restore, resume_problems
from leantrain.engine.checkpoint.save import Checkpointer, data_fingerprint
from leantrain.engine.devices.connector import choose_paths, finish_paths
from leantrain.engine.devices.distributed import distributed_summary, local_sgd, replica_spread, strategy_name
from leantrain.engine.devices.efficiency import ACCELERATE_PRECISION, resolve_model_choices, resolve_precision
from leantrain.engine.devices.paths import PathsContext
from leantrain.engine.evaluation.eval_schedule import eval_due, evaluate_and_log, evaluate_at
from leantrain.engine.training.faults import FaultInjector
from leantrain.engine.devices.host_allocator import host_memory
from leantrain.engine.training.loop_state import LoopState
from leantrain.engine.training.nonfinite import NonFiniteGuard
from leantrain.engine.setup.optimizer_setup import place
from leantrain.engine.setup.run_parts import Run, RunStart
from leantrain.engine.setup.run_description import RunDescription, describe_run
from leantrain.engine.evaluation.samples import check_sample_room, write_samples
from leantrain.engine.training.step import global_counts, step_metric_means, train_step
from leantrain.engine.setup.training_data import prepare_training_data
from leantrain.heartbeat import reporting
from leantrain.modeling import build_model, flop_parameters, parameter_counts
from leantrain.modeling.lora import apply_trainable
from leantrain.modeling.qlora import check_qlora_precision, load_kwargs as qlora_load_kwargs
from leantrain.methods.seam import StepBatches, StepContext
from leantrain.optim import state_report
from leantrain.optim.state import describe as describe_optim_state
from leantrain.perf.auto_micro_batch import auto_micro_batch
from leantrain.perf.flops import MfuMeter
from leantrain.perf.meter import PhaseClock, Throughput, largest_share, time_split
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
    run, state = build_run(start, described)
    loop = Loop(run, state)
    with reporting(loop.progress.sink):  # generation and evaluation say how far they are (rank 0)
        run_loop(loop)
        return finish(loop, wall_seconds=time.perf_counter() - t_start)


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


def build_run(start: RunStart, described: RunDescription) -> tuple[Run, LoopState]:
    """Data (as ``described``), batch layout, model (with its switches, the automatic micro-batch, compilation), optimizer, schedule,
    trackers, checkpointer and meters; and the loop's state, fresh or restored from the checkpoint."""
    cfg, accelerator, out = start.cfg, start.accelerator, start.out
    set_seed(cfg.train.seed)
    data = prepare_training_data(cfg, accelerator, described)
    check_sample_room(cfg, data)  # report.sample_prompts: their room in the model's positions, with its tokenizer
    layout = batch_layout(cfg, len(data.train), accelerator.num_processes)
    if cfg.train.micro_batch_size != "auto":  # with auto, the batch line comes once the micro-batch is chosen
        for note in layout.notes:
            log.info(note)

    fingerprint = data_fingerprint(data.train)  # the rows as read, before any precomputed column is added
    resume_problems(start.decision, cfg, accelerator, layout, fingerprint)  # refused: no model yet
    set_seed(cfg.train.seed)  # the new head's initialisation depends on the seed alone
    choices = resolve_model_choices(cfg, data.task, accelerator.device.type, start.precision)  # attention, compile
    model = build_model(cfg.model, data.label_names, data.task, attention=choices.attention,  # qlora: 4-bit here
                        extra=qlora_load_kwargs(cfg.peft.method, accelerator.local_process_index))
    model.config.update(data.task.report.saved_config(None))  # e.g. the target standardisation, saved with it
    if note := data.task.model.start_head(model):  # multi-label: a fresh head's bias at the labels' prior
        log.info("%s", note)
    model, trainable = apply_trainable(model, cfg.model, cfg.peft,  # LoRA (peft.*) and model.freeze
                                       gradient_checkpointing=cfg.efficiency.gradient_checkpointing)
    counts = parameter_counts(model)
    log.info("model: %s (%s), %.1fM parameters (%.1fM trainable)", data.model_name, type(model).__name__,
             counts["total"] / 1e6, counts["trainable"] / 1e6)
    micro = "auto" if cfg.train.micro_batch_size == "auto" else layout.micro_batch_size
    ctx = PathsContext("train", accelerator.device, cfg.efficiency, choices, data.task.traits,
                       strategy_name(cfg, accelerator.num_processes, quiet=True), bool(cfg.report.sample_prompts),
                       micro, cfg.data.block_size)
    paths = choose_paths(model, ctx)  # every fast path decided in one place; the converters made, compile aside
    data.bind_model(model, accelerator, cfg.train.eval_batch_size or 8)  # e.g. reference log-probs, before any resume
    if cfg.train.micro_batch_size == "auto":
        layout = batch_layout(cfg, len(data.train), accelerator.num_processes,
                              auto_micro_batch(cfg, model, data, accelerator, layout, start.precision))
    finish_paths(model, ctx, paths)  # compile, once the memory planner has measured the eager model
    for note in [*paths.lines(), *(layout.notes if cfg.train.micro_batch_size == "auto" else ())]:
        log.info(note)
    model.train()
    model, optimizer, scheduler, eval_dl, comm = place(cfg, accelerator, model, layout, data)
    attach_trackers(cfg, accelerator, out)

    faults = FaultInjector(accelerator.process_index)
    ckpt = Checkpointer(cfg, accelerator, out, layout, fingerprint, faults)
    state = restore(start.decision, cfg, accelerator, layout, ckpt.fingerprint, model, optimizer, scheduler)
    state.attach_method(data.task.step.state(cfg.train.seed, accelerator.process_index))
    metrics_log = MetricsLog(out / "metrics.jsonl" if accelerator.is_main_process else None, accelerator,
                             prior=prior_records(out, state) if accelerator.is_main_process else None)
    meter = Throughput(skip=cfg.train.warmup_steps_excluded)
    mean_tokens = float(np.mean(data.token_lengths)) if data.token_lengths is not None else 0.0
    inner = accelerator.unwrap_model(model)
    flops = MfuMeter(inner.config, flop_parameters(inner, counts), mean_tokens,
                     accelerator.device, start.precision, accelerator.num_processes)  # MFU is for token models only
    run = Run(start, model, optimizer, scheduler, eval_dl, data, layout, metrics_log, meter, ckpt, flops, faults,
              counts, comm, choices, trainable, paths)
    return run, state


def run_loop(loop: Loop) -> None:
    """The optimizer steps, with the restored RNG, the profiler and local SGD around them."""
    run, state = loop.run, loop.state
    if state.step == 0:  # report.sample_prompts: the continuations before training, to compare with
        write_samples(run.model, run.accelerator, run.data, 0, run.metrics_log)
    state.apply_rng(run.cfg.train.seed, run.accelerator.process_index)
    profiler = StepProfiler(run.cfg.efficiency.profile, run.start.out / "profile",
                            active=run.cfg.efficiency.profile_steps, is_main=run.accelerator.is_main_process)
    with local_sgd(run.accelerator, run.model, run.cfg.distributed.local_sgd_steps, run.comm) as lsgd, profiler:
        loop.steps(lsgd, profiler)


def finish(loop: Loop, *, wall_seconds: float) -> dict:
    """The final evaluation (unless the last step had one), the best model back in place, the outputs saved."""
    run, state, start = loop.run, loop.state, loop.run.start
    cfg, accelerator, model = run.cfg, run.accelerator, run.model
    loop.guard.check()
    last_eval = state.last_eval
    if state.eval_step != state.step:
        last_eval = evaluate_and_log(run, state.step)
        loop.best.update(last_eval, state.step, model)
    if cfg.checkpoint.save_model == "best":
        last_eval = loop.best.load_into(model) or last_eval
    split = loop.clock.summary()  # where the time went (summary.json's train.time_split_seconds)
    result = RunResult(
        layout=run.layout, meter=run.meter, steps=state.step, last_eval=last_eval, records=run.metrics_log.records,
        wall_seconds=wall_seconds, counts=run.counts, optim_state=loop.optim_state,
        speed={**run.flops.summary(run.meter.tokens_per_second), "time_split_seconds": split},
        efficiency=efficiency_summary(cfg.efficiency, accelerator, model, start.precision, start.precision_reason,
                                      start.allocator, run.choices),
        distributed=distributed_summary(cfg, accelerator, model, run.comm, run.meter),
        resumed_from_step=loop.resumed_from_step, skipped_steps=loop.guard.skipped,
        best=loop.best.summary(), trainable=run.trainable.record(cfg.peft) if run.trainable else None,
        paths=run.paths.record() if run.paths is not None else None,
    )
    summary = save_outputs(cfg, accelerator, model, run.data, result)
    summary["checkpoints"] = run.ckpt.finish()  # only now, with model/ and summary.json written, are they spare
    if accelerator.is_main_process:
        write_json(Path(cfg.output_dir) / "summary.json", summary)
    end_processes(accelerator)
    return summary


def _log_step(accelerator, model, state: LoopState, grad_norm, lr, meter, epoch) -> dict:
    """The one place the step's device values reach the host (a logging step): the loss and the step metrics since the
    last log, over every process."""
    count = float(state.running_count)  # global already (a method's device count was summed over the processes)
    loss = accelerator.reduce(state.running.clone(), reduction="sum").item() / (count if count > 0 else 1)  # a float
    rec = {"type": "train", "step": state.step, "epoch": round(epoch, 4), "loss": loss,
           **step_metric_means(state.metrics, accelerator), "lr": float(lr),
           "samples_per_second": meter.samples_per_second, "tokens_per_second": meter.tokens_per_second}
    if grad_norm is not None:
        rec["grad_norm"] = float(grad_norm)
    spread = replica_spread(model, accelerator)
    if spread is not None:
        rec["replica_spread"] = spread
    return rec


class Loop:
    """The epoch / step iteration over ``run``'s parts, moving ``state`` (one ``LoopState``: a fresh start or a
    checkpoint's) forward, with checkpoints of it, the best model, the non-finite guard and preemption."""

    def __init__(self, run: Run, state: LoopState):
        cfg, acc, out = run.cfg, run.accelerator, Path(run.cfg.output_dir)
        self.run, self.state = run, state
        self.resumed_from_step = state.step if state.resumed_from else None
        self.clock = PhaseClock()
        self.logged_step = state.step  # the step of the last train record: its time split's window starts there
        self.host_is_device = acc.device.type == "cpu"  # compute/optimizer split without any device sync
        self.grad_norm, self.lr = None, None
        self.guard = NonFiniteGuard(cfg, acc, out, np.asarray(run.data.train["length"]), run.layout,
                                    lambda: run.ckpt.last or state.resumed_from)
        self.step_optimizer = self.guard.optimizer(run.optimizer)
        self.guard.save_diagnostic = lambda last: run.ckpt.save_diagnostic(last, run.model, run.optimizer,
                                                                           run.scheduler)
        self.best = BestModel(cfg, acc, out, run.data.processor, state.best)
        self.preempt = Preemption(acc, run.layout, cfg.train.log_every_steps, run.ckpt.due)
        self.stopped = False
        self.optim_state: dict | None = None
        self.profiler: StepProfiler | None = None
        self.lsgd = None
        self.progress = Progress(run.layout.total_steps, enabled=acc.is_main_process, mode=cfg.report.progress,
                                 initial=state.step)

    @property
    def done(self) -> bool:
        return self.state.step >= self.run.layout.total_steps or self.stopped or self.best.should_stop

    def steps(self, lsgd=None, profiler: StepProfiler | None = None) -> None:
        state = self.state
        self.profiler = profiler
        self.preempt.install()
        try:
            if state.resumed_from and state.eval_step != state.step and eval_due(
                    self.run.cfg.train.eval_every_steps, state.step, self.run.layout):
                self.evaluate(state.step)  # stopped by a signal before the checkpoint: made now
            self.lsgd = lsgd
            while not self.done:
                self.run_epoch()
                state.next_epoch()
        finally:
            self.preempt.uninstall()
        self.progress.close()

    def run_epoch(self) -> None:
        run, state = self.run, self.state
        cfg, layout, acc = run.cfg, run.layout, run.accelerator
        start = state.start_step
        micro_batches = epoch_micro_batches(
            run.data.train, batch_size=layout.batch_size, seed=cfg.train.seed, epoch=state.epoch,
            batching=cfg.data.batching, group_size=cfg.data.group_size, drop_last=cfg.data.drop_last,
            rank=acc.process_index, world_size=layout.world_size, accum=layout.accum, start_step=start)
        batches = iter(train_loader(run.data.train, micro_batches, run.data.collator,
                                    num_workers=cfg.data.num_workers, pin_memory=acc.device.type == "cuda"))
        for global_batch in micro_batches.batches[start:]:
            if self.done:
                return
            run.meter.start_step()
            self.clock.start()
            with record_function("data"):
                loaded = [to_device(next(batches), acc.device, non_blocking=True) for _ in range(layout.accum)]
                loaded = run.faults.poison(loaded, state.step + 1)
            self.clock.lap("data")
            with record_function("batches"):
                made = self.make_batches(loaded, global_batch)
            if made.micro_batches is not loaded and self.host_is_device:
                self.clock.lap("batches")  # the method made its own (e.g. generation): a phase of its own
            first = state.step
            for update in range(made.updates):
                if state.step >= layout.total_steps:
                    break
                if update > 0:  # another update on the same batch: the position in the data stays
                    run.meter.start_step()
                    state.extra_updates += 1
                last = update == made.updates - 1 or state.step + 1 >= layout.total_steps
                self.update(made.micro_batches, count=made.count,
                            counted=self.meter_counts(global_batch, last, made.tokens))
                self.log_step(made.samples if update == 0 else ())
            self.at_boundary(first)
            run.faults.signal_after(state.step)
            if (stop := self.preempt.stop_signal(state.step)) is not None:  # preemption reports; the loop acts
                self.stop_on_signal(stop)

    def make_batches(self, loaded: list[dict], global_batch) -> StepBatches:
        """The method's batches for this global step (``Task.step.batches``; as loaded by default), with the loss's
        denominator over all processes."""
        run, state = self.run, self.state
        units = run.data.units_in(global_batch)  # the loss's denominator, the task's unit, known on the host
        ctx = StepContext(run.model, run.accelerator, state.step, state.method, lap=self.method_lap,
                          generating=run.faults.in_generation(state.step + 1))
        made = run.data.task.step.batches(ctx, loaded, units)
        count, tokens = global_counts(made.count, made.tokens, run.accelerator)  # one collective, when any
        return replace(made, count=count, tokens=tokens)

    def method_lap(self, phase: str, synced: bool = False) -> None:
        """A phase of the method's own batches (``StepContext.lap``) ends: counted where the host runs the device, or
        where the phase ended with a host read (``synced``: its device work is done)."""
        if synced or self.host_is_device:
            self.clock.lap(phase)

    def meter_counts(self, global_batch, credit: bool, made_tokens: int | None = None) -> tuple[int, int | None]:
        """The samples and tokens an update counts: the global batch's (the tokens the method made, when it says),
        on its last update (0 on the others)."""
        samples = len(global_batch)
        tokens = made_tokens if made_tokens is not None else self.run.data.tokens_in(global_batch)
        return (samples, tokens) if credit else (0, None if tokens is None else 0)

    def update(self, micro: list[dict], *, count, counted: tuple[int, int | None]) -> None:
        """One optimizer step on ``micro`` with the loss's denominator ``count``; its loss and step metrics added to
        the running ones, on the device; ``counted``: the samples and tokens the meter counts for it."""
        run, state = self.run, self.state
        cfg, acc = run.cfg, run.accelerator
        self.lr = run.scheduler.get_last_lr()[0]  # the rate this step applies (host value, no sync)
        loss_sum, self.grad_norm = train_step(
            run.model, micro, global_count=count, task=run.data.task,
            accelerator=acc, optimizer=self.step_optimizer,
            scheduler=run.scheduler, max_grad_norm=cfg.train.max_grad_norm,
            guard=functools.partial(self.guard.before_update, state.step + 1),
            on_phase=self.clock.lap if self.host_is_device else None, metrics=state.metrics,
        )
        self.guard.after_update(state.step + 1, self.step_optimizer, run.metrics_log)
        if self.lsgd is not None:
            self.lsgd.step()
        state.running += loss_sum
        state.running_count += count
        state.step += 1
        run.meter.end_step(*counted)
        run.faults.after_update(state.step)
        if self.profiler is not None:
            self.profiler.step()
        if self.optim_state is None:  # once, after the first step allocated the state (metadata only, no sync)
            self.optim_state = state_report(run.optimizer, cfg.optim.name)
            self.progress.write(describe_optim_state(self.optim_state))

    def log_step(self, samples=()) -> None:
        """At a logging step, the record of the steps since the last one (loss, step metrics, lr, speeds) and the
        method's ``samples`` of this step (``completions.jsonl``); the progress line at every step."""
        run, state = self.run, self.state
        step, task = state.step, run.data.task
        logged = None
        if step % run.cfg.train.log_every_steps == 0 or step == run.layout.total_steps:
            self.guard.check()
            with record_function("logging"):
                logged = _log_step(run.accelerator, run.model, state, self.grad_norm, self.lr, run.meter,
                                   epoch=state.batches / run.layout.steps_per_epoch)
            logged["mfu"] = run.flops.of(logged["tokens_per_second"])
            logged.update(time_split(self.clock.since_last(), step - self.logged_step))
            self.logged_step = step
            run.metrics_log.write(logged)
            run.metrics_log.write_samples(step, samples)
            run.metrics_log.to_trackers({"type": "time_split_seconds", "step": step, **self.clock.summary()})
            state.running.zero_()
            state.running_count = 0
            state.metrics.clear()
        shown = (*(k for k in task.traits.progress_keys if logged and k in logged), "lr",
                 f"{task.traits.speed_unit}_per_second")
        self.progress.update(step, {**{k: logged[k] for k in shown}, **largest_share(logged)} if logged else None)

    def at_boundary(self, first: int) -> None:
        """After the global step's updates (steps ``first`` + 1 .. ``state.step``): the evaluation and the checkpoint
        due at any of them, made at its end (a method's several updates on one batch are never split by one)."""
        run, step = self.run, self.state.step
        crossed = range(first + 1, step + 1)
        if any(eval_due(run.cfg.train.eval_every_steps, s, run.layout) for s in crossed):
            self.evaluate(step)
        if step < run.layout.total_steps and any(run.ckpt.due(s) for s in crossed):  # the final one: after the loop
            self.save_checkpoint()
        run.faults.after_step(step)

    def evaluate(self, step: int) -> None:
        """The evaluation due at ``step`` (engine/evaluation/eval_schedule.py); one process stops it at the next batch on a
        signal; several processes finish it."""
        stop = (lambda: self.preempt.signum != 0) if self.run.accelerator.num_processes == 1 else None
        if evaluate_at(self.run, self.state, self.best, step, self.progress, stop):
            self.stopped = True

    def stop_on_signal(self, name: str) -> None:
        """Stopped by signal ``name`` at this step boundary: the checkpoint, the processes ended, ``Preempted``."""
        path = self.checkpoint_now()
        self.progress.close()
        error = self.preempt.stopped(name, self.state.step, path)
        end_processes(self.run.accelerator)
        raise error

    def checkpoint_now(self) -> Path:
        """The checkpoint of this step: the one just saved, else a new one."""
        last = self.run.ckpt.last
        return last if last is not None and last.name.endswith(f"{self.state.step:07d}") else self.save_checkpoint()

    def save_checkpoint(self) -> Path:
        self.guard.check()  # a checkpoint is always a finite state
        run = self.run
        return run.ckpt.save(run.model, run.optimizer, run.scheduler, self.state.state_dict())
