"""leantrain: fine-tune Hugging Face models efficiently with PyTorch and Accelerate, from a laptop CPU to a cluster."""

from __future__ import annotations

from leantrain.version import __version__

__all__ = ["train", "__version__"]


def train(config=None, overrides: list[str] | None = None) -> dict:
    """Run a training job and return its summary (the same dict as ``output_dir/summary.json``).

    ``config`` may be a path to a YAML file, a nested dict (``{"train": {"lr": 3e-5}}``), a ``leantrain.config.Config``
    or None for the defaults; ``overrides`` are ``key=value`` strings as on the command line.
    """
    from leantrain.config import resolve  # lazy: `import leantrain` stays light (no torch)
    from leantrain.engine.training.loop import train as _train  # lazy: torch and transformers load on the first run

    return _train(resolve(config, overrides))
