"""``leantrain train``: resolve the config, check the data before any model or worker starts, then train here or
start the worker processes (``--nproc`` / ``--nnodes``) that train."""

from __future__ import annotations

import os
import sys

from leantrain.config import resolve
from leantrain.engine.loop import train
from leantrain.engine.preflight import check_train
from leantrain.engine.training_data import run_task, validate_data
from leantrain.launch.torchrun import LaunchOptions, inside_launcher, launch
from leantrain.modeling.tasks import get_task
from leantrain.report.final_line import final_line


def train_command(source: str | None, overrides: list[str], launch_options: LaunchOptions, *,
                  print_config: bool = False) -> int:
    cfg = resolve(source, overrides)
    if print_config:
        sys.stdout.write(cfg.to_yaml())
        return 0
    if not inside_launcher():
        launch_options.check()
        data = validate_data(cfg)  # bad data fails here, before any model or worker starts
        # model limits, output_dir, the batch over the processes: before any worker starts
        cfg = check_train(cfg, data, launch_options.nproc * launch_options.nnodes)
        if launch_options.wanted:
            return launch(cfg, launch_options)
    summary = train(cfg)
    ev = summary.get("eval") or {}
    if ev and os.environ.get("RANK", "0") == "0":
        task = get_task(run_task(cfg))
        print(final_line(task.headline(ev), summary, with_loss=task.unit != "tokens"))
    return 0
