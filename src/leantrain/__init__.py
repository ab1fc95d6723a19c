"""leantrain: fine-tune Hugging Face models efficiently with PyTorch and Accelerate, from a laptop CPU to a cluster."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["train", "__version__"]


def train(config=None, overrides: list[str] | None = None) -> dict:
    """Run a training job and return its summary (the same dict as ``output_dir/summary.json``).

    ``config`` may be a path to a YAML file, a nested dict (``{"train": {"lr": 3e-5}}``), a ``leantrain.config.Config``
    or None for the defaults; ``overrides`` are ``key=value`` strings as on the command line.
    """
    from leantrain.config import resolve
    from leantrain.engine.loop import train as _train

    return _train(resolve(config, overrides))
