"""``leantrain eval``'s per-class table and confusion matrix (JSON and PNG)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def per_class(preds: np.ndarray, labels: np.ndarray, names: list[str]) -> dict[str, dict]:
    """{name: {precision, recall, f1, support}} for every class of the model, in id order."""
    from sklearn.metrics import precision_recall_fscore_support

    p, r, f, s = precision_recall_fscore_support(labels, preds, labels=list(range(len(names))), zero_division=0)
    return {n: {"precision": float(p[i]), "recall": float(r[i]), "f1": float(f[i]), "support": int(s[i])}
            for i, n in enumerate(names)}


def confusion(preds: np.ndarray, labels: np.ndarray, names: list[str]) -> dict:
    """Rows: true label; columns: predicted label."""
    from sklearn.metrics import confusion_matrix

    matrix = confusion_matrix(labels, preds, labels=list(range(len(names))))
    return {"labels": list(names), "rows": "true label", "columns": "predicted label", "matrix": matrix.tolist()}


def format_table(classes: dict[str, dict]) -> str:
    width = max([len("label")] + [len(n) for n in classes])
    lines = [f"{'label':<{width}}  precision  recall      f1  support"]
    for name, m in classes.items():
        lines.append(f"{name:<{width}}  {m['precision']:9.4f}  {m['recall']:6.4f}  {m['f1']:6.4f}  {m['support']:7d}")
    return "\n".join(lines)


def write_confusion(stem: Path, cm: dict, title: str = "") -> tuple[Path, Path]:
    """``<stem>.json`` and ``<stem>.png``; returns both paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stem.parent.mkdir(parents=True, exist_ok=True)
    json_path, png_path = stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".png")
    json_path.write_text(json.dumps(cm, indent=2) + "\n")
    names, matrix = cm["labels"], np.asarray(cm["matrix"])
    size = min(4 + 0.45 * len(names), 20)
    fig, ax = plt.subplots(figsize=(size, size * 0.85))
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted label")
    ax.set_ylabel("true label")
    if len(names) <= 30:
        top = matrix.max() or 1
        for i in range(len(names)):
            for j in range(len(names)):
                ax.text(j, i, str(matrix[i, j]), ha="center", va="center",
                        color="white" if matrix[i, j] > top / 2 else "black", fontsize=8)
    ax.set_title(title or "confusion matrix")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return json_path, png_path


def confusion_stem(model_dir: str, output_path: str | None) -> Path:
    """Next to ``--output`` (x.json -> x.confusion.*); else in the run folder (the model folder's parent when it
    holds summary.json), else in the model folder: eval_confusion.*"""
    if output_path:
        out = Path(output_path)
        return out.with_name(out.stem + ".confusion")
    model = Path(model_dir)
    run = model.parent if (model.parent / "summary.json").is_file() else model
    return run / "eval_confusion"
