"""The model card: README.md in the saved model folder, as the Hugging Face Hub reads it.

Everything comes from the run's summary and resolved config; a missing key leaves its line out, never fails.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from leantrain.methods import TEXT, Task, get_task
from leantrain.units import format_bytes

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$")
_METRIC_NAMES = {"accuracy": "accuracy", "f1_macro": "macro F1", "mcc": "Matthews corr. (MCC)", "loss": "loss"}


def looks_like_hub_id(name: str | None) -> bool:
    """"org/name" or a legacy bare "name", and not a folder on this machine."""
    return bool(name) and bool(_HUB_ID.match(name)) and ".." not in name and not os.path.exists(name)


def human_bytes(n: float | int | None) -> str | None:
    """A summary's byte count for the card (``format_bytes``), or None when it is missing."""
    if not isinstance(n, (int, float)) or n < 0:
        return None
    return format_bytes(n)


def _fmt(value: Any) -> str:
    if isinstance(value, float) and not isinstance(value, bool):
        if not math.isfinite(value):
            return str(value)
        if value and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.3g}"  # 5e-05
        return f"{value:.4f}".rstrip("0").rstrip(".")
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    return "–" if value is None else str(value)


def _cell(text: Any) -> str:
    return _fmt(text).replace("|", "\\|").replace("\n", " ")


def _table(header: tuple[str, str], rows: list[tuple[Any, Any]]) -> list[str]:
    return [f"| {header[0]} | {header[1]} |", "|---|---|", *(f"| {_cell(k)} | {_cell(v)} |" for k, v in rows)]


def _eval_rows(ev: dict[str, Any], order: tuple[str, ...]) -> list[tuple[str, Any]]:
    flat = {k.removeprefix("eval."): v for k, v in ev.items()}
    keys = [k for k in order if k in flat]
    keys += sorted(k for k, v in flat.items() if k not in keys and k != "samples" and isinstance(v, (int, float)))
    return [(_METRIC_NAMES.get(k, k), flat[k]) for k in keys]


def _train_rows(tr: dict[str, Any], summary: dict[str, Any]) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []

    def add(label: str, value: Any, fmt=None) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            rows.append((label, fmt(value) if fmt else value))

    add("optimizer steps", tr.get("steps"))
    add("epochs", tr.get("epochs"))
    add("samples / second", tr.get("samples_per_second"), lambda v: f"{v:,.1f}")
    add("tokens / second", tr.get("tokens_per_second"), lambda v: f"{v:,.0f}")
    add("peak host memory (RSS)", tr.get("peak_memory_bytes"), human_bytes)
    add("peak GPU memory allocated", tr.get("cuda_max_allocated_bytes"), human_bytes)
    add("peak GPU memory reserved", tr.get("cuda_max_reserved_bytes"), human_bytes)
    add("wall time", tr.get("wall_seconds"), lambda v: f"{v:,.1f} s")
    device = summary.get("device") or {}
    if device.get("type"):
        rows.append(("device", " ".join(str(device[k]) for k in ("type", "name") if device.get(k))))
    add("processes", (summary.get("distributed") or {}).get("world_size"))
    return rows


def _hparam_rows(config: dict[str, Any]) -> list[tuple[str, Any]]:
    rows = []
    for section in ("train", "optim"):
        for key, value in (config.get(section) or {}).items():
            if value is None or isinstance(value, (str, int, float, bool, list, tuple)):
                rows.append((f"{section}.{key}", value))
    return rows


def write_model_card(
    model_dir: str | os.PathLike, *, base_model: str, label_names: list[str], summary: dict, config: dict,
    task: Task | None = None, final_dir: str | os.PathLike | None = None,
) -> Path:
    """Write model_dir/README.md (YAML front matter + Markdown) for a model of ``task`` (unset: the text
    classifier) and return its path. ``final_dir``: where the folder will be once moved in place (a folder written
    whole and then moved: ``leantrain.files.staged_folders``), the path its usage example names; default model_dir."""
    model_dir = Path(model_dir)
    shown_dir = Path(final_dir) if final_dir is not None else model_dir
    summary, config = summary or {}, config or {}
    ev, tr = summary.get("eval") or {}, summary.get("train") or {}
    hub = looks_like_hub_id(base_model)
    entry = task or get_task(TEXT)  # the task's card lines and pipeline name
    meta: dict[str, Any] = {"library_name": "transformers", "pipeline_tag": entry.traits.loads_as}
    if hub:
        meta["base_model"] = base_model
    meta["tags"] = ["leantrain"]
    short = Path(str(base_model)).name
    base_text = f"[{base_model}](https://huggingface.co/{base_model})" if hub else f"a local model (`{short}`)"
    if str(base_model).endswith("(from config)"):  # model.config / model.config_type: trained from scratch
        base_text = f"a random initialisation of a `{str(base_model).removesuffix(' (from config)')}` config"

    lines = ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", ""]
    noun = entry.card.noun
    lines += [f"# {short}, fine-tuned for {entry.card.title}", ""]
    on_labels = f" on {len(label_names)} labels" if label_names else ""
    lines += [f"A{'n' if noun[0] in 'aeiou' else ''} {noun} fine-tuned from {base_text} with leantrain{on_labels}.", ""]
    if label_names:
        lines += ["## Labels", "", *_table(("id", "label"), list(enumerate(label_names))), ""]
    if data_rows := entry.report.card_rows(summary, config):  # the task's (causal LM: corpus, tokens, block size, perplexity)
        lines += ["## Training data", "", *_table(("item", "value"), data_rows), ""]
    if ev:
        n = ev.get("samples", ev.get("eval.samples"))
        lines += ["## Evaluation", "", f"On {n:,} held-out examples:" if isinstance(n, int) else "On the eval set:", ""]
        lines += [*_table(("metric", "value"), _eval_rows(ev, entry.spec.metrics)), ""]
    if harness := summary.get("harness"):  # eval.harness_tasks: lm-evaluation-harness's own scores
        rows = [(f"{task} {metric}", value) for task, metrics in harness.items() for metric, value in metrics.items()
                if metric != "sample_len"]
        lines += ["## Evaluation harness", "", "EleutherAI's lm-evaluation-harness on the saved model "
                  f"(tasks: {', '.join(harness)}):", "", *_table(("task metric", "value"), rows), ""]
    saved = model_dir / "config.json"
    lines += entry.report.card_notes(json.loads(saved.read_text()) if saved.is_file() else {})  # e.g. standardised scores
    if hparams := _hparam_rows(config):
        lines += ["## Training hyperparameters", "", *_table(("setting", "value"), hparams), ""]
    if cost := _train_rows(tr, summary):
        lines += ["## Throughput and memory", "", *_table(("measure", "value"), cost), ""]
    if versions := summary.get("versions"):
        lines += ["## Framework versions", "", *(f"- {k} {v}" for k, v in versions.items()), ""]
    var = entry.card.variable
    lines += [
        "## Usage", "", "```python", "from transformers import pipeline", "",
        f'{var} = pipeline("{entry.traits.loads_as}", model="{shown_dir.as_posix()}")  # or its Hub id once pushed',
        f"print({var}({entry.card.example}))", "```", "",
    ]
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / "README.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
