"""One validated description of a run, built once per process before any worker or model starts: the config as
checked (``data.max_length`` / ``data.block_size`` maybe lowered to the model's limit), the run's Task (resolved
once: ``model.task`` or what ``auto`` decides), why, and the data loaded and checked. ``leantrain train`` builds it
and hands it to ``engine.loop.train`` (one process) or to its workers (``--nproc``: through ``engine.run_file``);
whoever holds it trusts it and checks nothing of it again.

Three ways a process gets its description (``describe_run``):

- one process (``leantrain train``, ``leantrain.train()``): every check here, the data loaded once and kept for
  training (what the loader logs is held and logged where training takes the data, as a run always showed it);
- a worker of ``leantrain train --nproc N``: the parent's description (the config it wrote, the task from
  ``run.json``); no check again; the worker loads its rows (the main process first) unchecked;
- a worker of your own ``torchrun`` / ``accelerate launch``: the config checks here, the data loaded and checked
  where training takes it (``prepare_training_data``: the main process first, so the others read its cache).
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass, field

from leantrain.config import Config
from leantrain.engine.devices.accelerator import device_type
from leantrain.engine.setup.preflight import check_train, check_max_length
from leantrain.engine.setup.run_file import inside_launcher, read_run_file
from leantrain.engine.setup.training_data import check_loaded_data, check_task_keys, load_data, run_task_reason
from leantrain.methods import Task, get_task

log = logging.getLogger("leantrain")


@dataclass
class RunDescription:
    """A run as checked: what ``engine.loop.train`` and the workers trust."""

    cfg: Config
    task: Task  # the run's task, as registered (``Task.configured`` adds the run's settings)
    task_reason: str = ""  # why model.task=auto chose it ("" when set)
    data: object | None = None  # PreparedData, loaded and checked (one process); None: loaded where training starts
    data_checked: bool = True  # False: check the data where it is loaded (a worker of your own launcher)
    held_logs: list = field(default_factory=list, repr=False)  # what loading the data logged, logged with the data

    def facts(self) -> dict:
        """What the workers need beside the config (``engine.run_file``)."""
        return {"task": self.task.name, "task_reason": self.task_reason}

    def take_data(self):  # noqa: ANN201 - PreparedData
        """The kept data, once; what loading it logged is logged now (where a run always showed it)."""
        data, self.data = self.data, None
        for record in self.held_logs:
            if log.isEnabledFor(record.levelno):
                log.handle(record)
        self.held_logs = []
        return data


def describe_run(cfg: Config, world_size: int = 1, *, launching: bool = False) -> RunDescription:
    """The run of ``cfg`` on ``world_size`` processes, checked: the task resolved, the keys that depend on it, the data
    (loaded once; kept unless ``launching``: the workers load their own), what the model and the output folder
    need (``check_train``). A worker started by ``leantrain train --nproc`` takes its parent's instead."""
    if (facts := read_run_file()) is not None:
        return RunDescription(cfg, get_task(facts["task"]), facts.get("task_reason", ""))
    own_launcher = inside_launcher()  # your own torchrun / accelerate launch: the data checked where it loads
    world_size = int(os.environ["WORLD_SIZE"]) if own_launcher else world_size
    task, why = run_task_reason(cfg)  # once: reads the model's config.json under model.task=auto
    cfg = check_max_length(cfg, task)  # first: the data's blocks are cut at data.block_size
    check_task_keys(cfg, task)
    run = RunDescription(cfg, task, why, data_checked=not own_launcher)
    data = None
    if not own_launcher:
        with holding_logs(not launching) as run.held_logs:
            data = load_data(cfg, task)
        check_loaded_data(cfg, task, data)
        run.data = None if launching else data
    check_train(cfg, task, data, world_size, device_type())
    return run


@contextmanager
def holding_logs(hold: bool):
    """What leantrain logs inside, kept as records instead (``hold``), at INFO whatever the level set yet."""
    records: list = []
    if not hold:
        yield records
        return

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    handlers, level, propagate = log.handlers[:], log.level, log.propagate
    log.handlers, log.propagate = [keep], False
    log.setLevel(logging.INFO)
    try:
        yield records
    except BaseException:
        log.handlers, log.propagate = handlers, propagate
        log.setLevel(level)
        for record in records:  # the load failed: its warnings go where they would have gone
            if record.levelno >= logging.WARNING and log.isEnabledFor(record.levelno):
                log.handle(record)
        raise
    log.handlers, log.propagate = handlers, propagate
    log.setLevel(level)
