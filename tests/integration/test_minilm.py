"""Integration: the packaged pretrained MiniLM on real data from ../shared/data, and the README's commands."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import REPO, shared_data
from leantrain import train
from leantrain.cli import main
from leantrain.engine.devices.efficiency import cpu_has_native_bf16

pytestmark = pytest.mark.slow


def _sst2_args(tmp):
    """MiniLM fine-tuned for one epoch on a seeded 1,000-row slice of SST-2 train at lr 3e-4, evaluated on all of
    dev (the default lr 3e-5 needs about twice the rows to get clear of the majority class)."""
    if not (tmp / "train.tsv").exists():
        full = pd.read_csv(shared_data("sst2", "train.tsv"), sep="\t", quoting=3)
        full.sample(n=1000, random_state=0).to_csv(tmp / "train.tsv", sep="\t", index=False)
    return [f"data.train={tmp / 'train.tsv'}", f"data.eval={shared_data('sst2', 'dev.tsv')}", "train.epochs=1",
            "train.lr=3e-4", "train.seed=0"]


@pytest.fixture(scope="module")
def sst2_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sst2")
    out = tmp / "run"
    summary = train(None, [*_sst2_args(tmp), f"output_dir={out}", "efficiency.precision=fp32"])
    return summary, out


def test_minilm_learns_sst2(sst2_run):
    summary, out = sst2_run
    assert summary["eval"]["samples"] == 872
    assert summary["eval"]["accuracy"] > 0.75, summary["eval"]  # chance is ~0.51 (majority class)
    assert summary["train"]["steps"] == 32  # ceil(1000 / 32)
    assert summary["train"]["tokens_per_second"] > 0 and summary["train"]["peak_memory_bytes"] > 0


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no avx512_bf16/amx_bf16: bf16 autocast is "
                    "emulated, and one epoch of MiniLM on 2,000 rows takes longer than the test's timeout (a GPU, or a "
                    "CPU that runs bf16 natively, runs it)")
def test_bf16_learns_sst2_as_well_as_fp32(sst2_run):
    """The same run under bf16 autocast (efficiency.precision=bf16) ends within a few points of fp32."""
    fp32, out = sst2_run
    bf16 = train(None, [*_sst2_args(out.parent), f"output_dir={out.parent / 'bf16'}", "efficiency.precision=bf16",
                        "report.plots=false"])
    assert bf16["efficiency"]["precision"] == "bf16" and fp32["efficiency"]["precision"] == "fp32"
    assert abs(bf16["eval"]["accuracy"] - fp32["eval"]["accuracy"]) <= 0.03, (bf16["eval"], fp32["eval"])
    assert bf16["train"]["peak_flops"] != fp32["train"]["peak_flops"]  # MFU against the bf16 peak


def test_saved_model_pipeline_matches_predict(sst2_run, tmp_path):
    from transformers import pipeline

    _, out = sst2_run
    dev = pd.read_csv(shared_data("sst2", "dev.tsv"), sep="\t", quoting=3).head(100)
    dev[["sentence"]].to_csv(tmp_path / "new.csv", index=False)
    assert main(["predict", str(out / "model"), "--input", str(tmp_path / "new.csv"), "--output",
                 str(tmp_path / "p.jsonl")]) == 0
    ours = [json.loads(x)["label"] for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    theirs = [p["label"] for p in pipeline("text-classification", model=str(out / "model"), device="cpu")(
        dev["sentence"].tolist())]
    assert ours == theirs and set(ours) <= {"0", "1"}


def test_readme_default_command_smoke(tmp_path):
    """`leantrain train` (the README's main job) through the installed console script, a few steps only."""
    exe = Path(sys.executable).with_name("leantrain")
    env = dict(os.environ, LEANTRAIN_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([str(exe), "train", "train.max_steps=3", f"output_dir={tmp_path / 'run'}"],
                       capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "eval accuracy:" in r.stdout and "built-in demo" in r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["model"]["labels"] == ["negative", "neutral", "positive"] and summary["train"]["steps"] == 3
