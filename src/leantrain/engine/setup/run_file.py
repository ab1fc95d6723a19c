"""The file through which the workers of a multi-process run trust what their parent checked: ``leantrain train
--nproc N`` checks the config and the data once (``engine.run_description.describe_run``), writes the resolved config
for the workers' command line and, beside it, this JSON file (the run's task and why; the data checked), named to
the workers by the ``LEANTRAIN_RUN_FILE`` environment variable. A worker reads it instead of checking again; named
but missing, it stops with exit status 2 (never a silent second round of checks). Light: no torch here (the
launcher imports it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from leantrain.errors import UserError

RUN_FILE = "LEANTRAIN_RUN_FILE"  # set by the launcher: the parent's run description for its workers


def inside_launcher() -> bool:
    """True in a worker started by torchrun / accelerate launch (never launch again from there)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def write_run_file(folder: Path, facts: dict) -> dict[str, str]:
    """``facts`` written to ``folder/run.json``; returns the environment entry that names it to the workers."""
    path = Path(folder) / "run.json"
    path.write_text(json.dumps(facts))
    return {RUN_FILE: str(path)}


def read_run_file() -> dict | None:
    """The parent's run description, or None when no launcher of leantrain's named one (a single process, or the
    workers of your own ``torchrun`` / ``accelerate launch``: they check for themselves). Named and missing or
    unreadable: UserError (exit 2). Read inside a launcher only (a single process ignores a stray variable)."""
    path = os.environ.get(RUN_FILE)
    if not path or not inside_launcher():
        return None
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{RUN_FILE}={path}: the run description written by `leantrain train --nproc` is missing (was "
                        "its temporary folder removed?); start the run again") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{RUN_FILE}={path}: cannot read the run description written by `leantrain train --nproc` "
                        f"({e}); start the run again") from None
