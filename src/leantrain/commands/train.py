"""``leantrain train``: resolve the config, describe and check the run (config, task, data) once, before any model or
worker starts, then train here or start the worker processes (``--nproc`` / ``--nnodes``) that train and trust it."""

from __future__ import annotations

import os
import sys

from leantrain.config import resolve
from leantrain.engine.training.loop import train
from leantrain.engine.setup.run_description import describe_run
from leantrain.launch.torchrun import LaunchOptions, inside_launcher, launch
from leantrain.report.final_line import final_line


def train_command(source: str | None, overrides: list[str], launch_options: LaunchOptions, *,
                  print_config: bool = False) -> int:
    cfg = resolve(source, overrides)
    if print_config:
        sys.stdout.write(cfg.to_yaml())
        return 0
    launching = launch_options.wanted and not inside_launcher()
    if not inside_launcher():
        launch_options.check()
    # bad data fails here, then model limits, output_dir, the batch over the processes: before any worker starts
    run = describe_run(cfg, launch_options.nproc * launch_options.nnodes, launching=launching)
    if launching:
        return launch(run.cfg, launch_options, run.facts())
    summary = train(run)
    ev = summary.get("eval") or {}
    if ev and os.environ.get("RANK", "0") == "0":
        print(final_line(run.task.evaluation.headline(ev), summary, with_loss=not run.task.traits.headline_loss))
    return 0
