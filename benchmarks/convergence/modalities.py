"""Images and audio to convergence (not a test): small from-config models on the whole shared sets.

    PYTHONPATH=src python -m benchmarks.convergence.modalities [--epochs-image 6] [--epochs-audio 8]

- images: CIFAR-10 subset (3,000 train / 1,000 test, 10 classes, 32 px), a 2-stage ConvNeXt from config, with and
  without the light augmentation (data.augment), same run, interleaved;
- audio: FSDD (official split: 2,700 / 300 clips, 10 digits, 8 kHz resampled to 16 kHz), a 2-layer Audio
  Spectrogram Transformer from config on 32 mel bins.

Each configuration runs in its own process (peak RSS is per process) and its summary.json gives accuracy, loop
time, samples/s and peak memory. The section "Images and audio" of benchmarks/results/images-and-audio.md is rewritten.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.driver.jobs import DATA, REPO

CONVNEXT = ["model.config_type=convnext", "model.config_overrides.image_size=32", "model.config_overrides.num_stages=2",
            "model.config_overrides.hidden_sizes=[32,64]", "model.config_overrides.depths=[2,2]"]
AST = ["model.config_type=audio-spectrogram-transformer", "model.config_overrides.num_mel_bins=32",
       "model.config_overrides.max_length=128", "model.config_overrides.hidden_size=64",
       "model.config_overrides.num_hidden_layers=2", "model.config_overrides.num_attention_heads=2",
       "model.config_overrides.intermediate_size=128", "model.config_overrides.frequency_stride=16",
       "model.config_overrides.time_stride=8", "data.max_seconds=1.28"]


def fsdd_split(folder: Path) -> tuple[Path, Path]:
    import pandas as pd

    meta = pd.read_csv(DATA / "fsdd" / "metadata.csv")
    meta["file_name"] = [str(DATA / "fsdd" / f) for f in meta.file_name]
    out = []
    for split in ("train", "test"):
        path = folder / f"fsdd_{split}.csv"
        meta[meta.split == split][["file_name", "label"]].to_csv(path, index=False)
        out.append(path)
    return out[0], out[1]


def run(name: str, args: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "leantrain", "train", *args, f"output_dir={out / name}", "report.progress=plain",
           "train.log_every_steps=50", "report.plots=false"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    s = json.loads((out / name / "summary.json").read_text())
    tr = s["train"]
    row = {"name": name, "accuracy": s["eval"]["accuracy"], "f1_macro": s["eval"]["f1_macro"],
           "eval_samples": s["eval"]["samples"], "steps": tr["steps"], "epochs": tr["epochs"],
           "samples_per_second": tr["samples_per_second"], "loop_seconds": tr["loop_seconds"],
           "wall_seconds": time.perf_counter() - t0, "peak_rss_gib": tr["peak_memory_bytes"] / 2**30,
           "parameters": s["model"]["parameters"]["total"]}
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> list[str]:
    lines = ["| run | params | epochs (steps) | eval accuracy | macro-F1 | train samples/s | loop time | wall time "
             "| peak RSS |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['parameters'] / 1e3:.0f}k | {r['epochs']:g} ({r['steps']}) | "
                     f"{r['accuracy']:.3f} (n={r['eval_samples']}) | {r['f1_macro']:.3f} | {r['samples_per_second']:.0f} | "
                     f"{r['loop_seconds']:.0f} s | {r['wall_seconds']:.0f} s | {r['peak_rss_gib']:.2f} GiB |")
    return lines


def write_results(rows: list[dict], command: str) -> None:
    path = REPO / "benchmarks" / "results" / "images-and-audio.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    head = "## Images and audio"
    if head in text:  # replace this section only
        before, rest = text.split(head, 1)
        nxt = rest.find("\n## ")
        text = before.rstrip() + ("\n\n" + rest[nxt + 1:] if nxt >= 0 else "\n")
    ratio = {r["name"]: r for r in rows}
    aug = ""
    if "image, augment" in ratio and "image, plain" in ratio:
        a, p = ratio["image, augment"], ratio["image, plain"]
        aug = (f"\nSame-run ratios: augmentation costs {p['samples_per_second'] / a['samples_per_second']:.2f}x in "
               f"samples/s and changes accuracy by {a['accuracy'] - p['accuracy']:+.3f}.\n")
    section = [head, "", f"Command: `{command}`", "",
               f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores shared with other jobs (absolute times are "
               "noisy; compare within the run), torch CPU, no GPU. Models are random-initialised from a config "
               "(no pretrained image or audio model is reachable here), so the accuracies are from-scratch numbers "
               "on small sets, chance = 0.100 for both.", "",
               "- image: CIFAR-10 subset `train/` (3,000) -> `test/` (1,000), imagefolder layout; "
               "2-stage ConvNeXt (hidden 32/64, depths 2/2) at 32 px; batch 32, lr 2e-3.",
               "- audio: FSDD official split (2,700 -> 300 clips), metadata CSV with a path column; "
               "AST from config (2 layers, hidden 64, 32 mel bins, 128 frames); batch 32, lr 2e-3.",
               "- samples/s over the training loop only; tokens/s is not reported for images or audio.", "",
               *table(rows), aug]
    path.write_text(text.rstrip() + "\n\n" + "\n".join(section).rstrip() + "\n")
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs-image", type=float, default=6)
    p.add_argument("--epochs-audio", type=float, default=8)
    p.add_argument("--skip-plain", action="store_true", help="only the augmented image run")
    ns = p.parse_args()
    common = ["train.batch_size=32", "train.lr=2e-3"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        train_csv, test_csv = fsdd_split(out)
        image = [*CONVNEXT, f"data.train={DATA / 'cifar10_subset'}", f"train.epochs={ns.epochs_image}", *common]
        rows.append(run("image, augment", [*image, "data.augment=true"], out))
        if not ns.skip_plain:
            rows.append(run("image, plain", image, out))
        rows.append(run("audio", [*AST, f"data.train={train_csv}", f"data.eval={test_csv}",
                                  f"train.epochs={ns.epochs_audio}", *common], out))
    write_results(rows, "PYTHONPATH=src python -m benchmarks.convergence.modalities " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
