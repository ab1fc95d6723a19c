"""Loss curve of a run from its metrics.jsonl records: train loss, eval loss and accuracy (or reward accuracy), a
panel per step metric of the method (e.g. a reward), the share of each phase of the step (``time_share``: data,
generation, scoring, compute, optimizer...) stacked, learning rate."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any


def _series(records: list[dict[str, Any]], kind: str, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric, skipping rows without it or with a non-finite value ("nan" in JSON)."""
    xs, ys = [], []
    for r in records:
        x, y = r.get("step"), r.get(key)
        if r.get("type", "train") != kind or isinstance(y, bool) or not isinstance(x, (int, float)):
            continue
        if isinstance(y, (int, float)) and math.isfinite(y):
            xs.append(float(x))
            ys.append(float(y))
    return xs, ys


# what every train record holds; any other number in one is a step metric of the method (``Task.step.loss``)
TRAIN_RECORD_KEYS = ("type", "step", "epoch", "loss", "lr", "samples_per_second", "tokens_per_second", "grad_norm",
                     "replica_spread", "mfu", "time_split", "time_share")


def step_metric_keys(records: list[dict[str, Any]]) -> list[str]:
    """The step metrics the train records hold, in the order first seen."""
    keys: dict[str, None] = {}
    for r in records:
        if r.get("type", "train") == "train":
            keys.update((k, None) for k in r if k not in TRAIN_RECORD_KEYS)
    return list(keys)


def time_shares(records: list[dict[str, Any]]) -> tuple[list[float], dict[str, list[float]]]:
    """(steps, {phase: shares}) of the train records' ``time_share`` (0 where a window had no such phase)."""
    rows = [r for r in records if r.get("type", "train") == "train" and r.get("time_share")]
    phases: dict[str, None] = {}
    for r in rows:
        phases.update((k, None) for k in r["time_share"])
    return [float(r["step"]) for r in rows], {k: [float(r["time_share"].get(k, 0.0)) for r in rows] for k in phases}


def short_model_name(name: str, limit: int = 48) -> str:
    """A model's name short enough for a chart title: a local folder's last part (``runs/x/model`` -> ``x/model``,
    a folder called model says little alone), a Hub id as it is; cut in the middle beyond ``limit`` characters."""
    text = str(name).rstrip("/\\")
    parts = Path(text).parts
    if os.path.isabs(text) or text.startswith(".") or len(parts) > 2 or Path(text).is_dir():
        keep = 2 if len(parts) > 1 and parts[-1] in ("model", "best", "final") else 1
        text = "/".join(parts[-keep:])
    return text if len(text) <= limit else text[: limit // 2 - 1] + "…" + text[-(limit - limit // 2):]


def plot_loss_curve(records: list[dict[str, Any]], path: str | os.PathLike, title: str = "") -> Path | None:
    """Save a PNG: loss (train line, eval markers) and eval accuracy above, a panel per step metric, learning rate
    below.

    Returns the path, or None when the records hold no loss to plot.
    """
    train = _series(records, "train", "loss")
    evl = _series(records, "eval", "eval.loss")
    acc = _series(records, "eval", "eval.accuracy")
    acc_name = "eval accuracy"
    if not acc[0]:  # a preference-tuned policy: the share of pairs whose chosen reward is higher
        acc, acc_name = _series(records, "eval", "eval.reward_accuracy"), "eval reward accuracy"
    lr = _series(records, "train", "lr")
    if not (train[0] or evl[0] or acc[0]):
        return None
    metrics = [(k, _series(records, "train", k)) for k in step_metric_keys(records)]
    metrics = [(k, series) for k, series in metrics if series[0]]
    shares = time_shares(records)
    panels = len(metrics) + (1 if shares[0] else 0)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        2 + panels, 1, sharex=True, figsize=(8, 5.5 + 1.6 * panels),
        gridspec_kw={"height_ratios": [3] + [1.2] * panels + [1]}, constrained_layout=True
    )
    ax, ax_lr = axes[0], axes[-1]
    try:
        for ax_m, (name, series) in zip(axes[1:-1], metrics):
            ax_m.plot(*series, color="tab:red", lw=1.2)
            ax_m.set_ylabel(name, fontsize=8)
            ax_m.grid(alpha=0.3)
        if shares[0]:  # where each logging window's time went, stacked: generation against training at a glance
            ax_t = axes[-2]
            ax_t.stackplot(shares[0], *shares[1].values(), labels=list(shares[1]), alpha=0.8)
            ax_t.set_ylim(0, 1)
            ax_t.set_ylabel("time share", fontsize=8)
            ax_t.legend(loc="upper left", fontsize=7, ncol=min(4, len(shares[1])), framealpha=0.8)
        handles = []
        if train[0]:
            handles += ax.plot(*train, color="tab:blue", lw=1.5, label="train loss")
        if evl[0]:
            handles += ax.plot(*evl, "o", color="tab:orange", ms=6, label="eval loss")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        top = ax
        if acc[0]:
            top = ax.twinx()
            handles += top.plot(*acc, "s--", color="tab:green", ms=5, lw=1, label=acc_name)
            top.set_ylabel(acc_name)
            top.set_ylim(0, 1.02)
        # on the topmost axes so nothing draws over it; loss falls and accuracy rises, the middle right stays clear
        top.legend(handles=handles, loc="center right", fontsize=9, framealpha=0.9)
        ax.set_title(title or "training run")
        if lr[0]:
            ax_lr.plot(*lr, color="tab:purple", lw=1.2)
            ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        else:
            ax_lr.text(0.5, 0.5, "no learning-rate records", ha="center", va="center", transform=ax_lr.transAxes)
        ax_lr.set_ylabel("lr")
        ax_lr.set_xlabel("optimizer step")
        ax_lr.grid(alpha=0.3)
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    finally:
        plt.close(fig)
    return out
