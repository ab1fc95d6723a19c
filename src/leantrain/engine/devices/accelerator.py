"""Accelerator set-up: the device, the Accelerator (precision, DeepSpeed, process-group timeout), logging per rank,
trackers, the default run folder."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

from leantrain.config import Config
from leantrain.errors import ConfigError
from leantrain.modeling.generation.backends import release as release_generation

log = logging.getLogger("leantrain")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (notebooks and test runners swap it), not the one at set-up."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging(is_main: bool) -> None:
    """Main process logs INFO to stderr; the others only warnings and errors, tagged with their rank."""
    logger = logging.getLogger("leantrain")
    if not any(getattr(h, "_leantrain", False) for h in logger.handlers):
        handler = _StderrHandler()
        rank = os.environ.get("RANK", "0")
        handler.setFormatter(logging.Formatter("%(message)s" if is_main else f"[rank {rank}] %(levelname)s %(message)s"))
        handler._leantrain = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if is_main else logging.WARNING)
    quiet_libraries()


def quiet_libraries() -> None:
    """transformers' load report and weight-loading bars say nothing leantrain does not say in one line."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    if not (sys.stdout.isatty() and sys.stderr.isatty()):  # a log file: no carriage-return bars from datasets.map
        import datasets

        datasets.disable_progress_bars()


def has_accelerator() -> bool:
    return torch.cuda.is_available() or (hasattr(torch.backends, "mps") and torch.backends.mps.is_available())


def device_type() -> str:
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if has_accelerator() else "cpu"


def make_accelerator(cfg: Config, project_dir: Path | None, mixed_precision: str = "no"):
    from datetime import timedelta

    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if not has_accelerator() and local > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()  # a new run in the same process (notebook, tests) may change the precision
    accelerator = Accelerator(
        cpu=not has_accelerator(),
        mixed_precision=mixed_precision,
        project_config=ProjectConfiguration(project_dir=str(project_dir)) if project_dir else None,
        step_scheduler_with_optimizer=False,  # we step the scheduler once per optimizer step ourselves
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.distributed.timeout_seconds))],
        deepspeed_plugin=deepspeed_plugin(cfg),
    )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if accelerator.num_processes != world:
        raise RuntimeError(
            f"Accelerate sees {accelerator.num_processes} process(es) but WORLD_SIZE={world}: the launcher and "
            "Accelerate disagree (e.g. `accelerate launch --cpu` starts one process); use `leantrain train --nproc N`"
        )
    return accelerator


def end_processes(accelerator) -> None:
    """The run's end, finished or stopped: a generation engine of its own shut down (vLLM's, which holds process groups
    too), trackers closed and the process group destroyed (else gloo aborts at exit under torchrun)."""
    release_generation()
    accelerator.end_training()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def attach_trackers(cfg: Config, accelerator, run_dir: Path) -> None:
    """Accelerate's trackers (report.trackers), logging under the run folder (those that take a folder: TensorBoard);
    trackio keeps its own store (TRACKIO_DIR, default ~/.cache/huggingface/trackio), project ``leantrain``, the run
    named after the run folder. The folder is known only once the ranks agree on it, after the Accelerator exists, so
    the trackers are attached here rather than at construction."""
    if not cfg.report.trackers:
        return
    from accelerate.tracking import filter_trackers

    accelerator.project_configuration.set_directories(str(run_dir))
    accelerator.log_with = filter_trackers(list(cfg.report.trackers), accelerator.logging_dir)
    accelerator.init_trackers("leantrain", config=_flat_scalars(cfg.to_dict()),
                              init_kwargs={"trackio": {"name": run_dir.name, "embed": False}})


def _flat_scalars(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat_scalars(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


def deepspeed_plugin(cfg: Config):
    """DeepSpeed ZeRO from the user's JSON config (CUDA only); None for every other strategy."""
    if cfg.distributed.strategy != "deepspeed":
        return None
    if not torch.cuda.is_available():
        raise ConfigError("distributed.strategy=deepspeed needs CUDA GPUs; on CPU use ddp or fsdp")
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        raise ConfigError("distributed.strategy=deepspeed needs the deepspeed package: pip install deepspeed") from None
    from accelerate.utils import DeepSpeedPlugin

    path = Path(cfg.distributed.deepspeed_config)
    check_deepspeed_json(path)
    return DeepSpeedPlugin(hf_ds_config=str(path))


def check_deepspeed_json(path: Path) -> dict:
    """The DeepSpeed config at ``path``, or a ConfigError naming the file and what is wrong: missing, not a JSON
    object, or an ``optimizer`` / ``scheduler`` section (leantrain's ``optim.*`` and ``train.*`` build both; Accelerate
    would then expect placeholder objects leantrain does not pass)."""
    if not path.is_file():
        raise ConfigError(f"distributed.deepspeed_config: file not found: {path}")
    try:
        config = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"distributed.deepspeed_config: {path} is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"distributed.deepspeed_config: {path} must hold a JSON object, not {type(config).__name__}")
    owned = [key for key in ("optimizer", "scheduler") if key in config]
    if owned:
        raise ConfigError(f"distributed.deepspeed_config: {path} has {' and '.join(repr(k) for k in owned)}, which "
                          "leantrain builds itself from optim.* and train.*; remove them from the file")
    return config


def default_output_dir() -> str:
    return str(Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
