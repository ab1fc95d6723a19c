"""GPU-only paths (fp16 with a grad scaler, bf16 on CUDA, bitsandbytes' 8-bit AdamW on CUDA, NCCL). Skipped without
CUDA: CI has no GPU; run `pytest -m gpu` on a GPU machine."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers import alternating_rows, write_rows
from leantrain import train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _args(tmp_path, tiny_bert, *extra):
    data = write_rows(tmp_path / "train.csv", alternating_rows(96))
    return [f"model.name={tiny_bert}", f"data.train={data}", "train.batch_size=16", "train.max_steps=8",
            "train.lr=1e-3", "report.plots=false", f"output_dir={tmp_path / 'run'}", *extra]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_on_cuda_trains(tmp_path, tiny_bert, precision):
    summary = train(None, _args(tmp_path, tiny_bert, f"efficiency.precision={precision}"))
    assert summary["efficiency"]["precision"] == precision and summary["device"]["type"] == "cuda"
    assert math.isfinite(summary["train"]["final_loss"]) and summary["train"]["cuda_max_allocated_bytes"] > 0


def test_adamw8bit_on_cuda(tmp_path, tiny_bert):
    pytest.importorskip("bitsandbytes")
    summary = train(None, _args(tmp_path, tiny_bert, "optim.name=adamw8bit"))
    assert summary["optim"]["state_bytes_per_param"] < 3


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_nccl(tmp_path, tiny_bert):
    r = subprocess.run([sys.executable, "-m", "leantrain", "train", "--nproc", "2", *_args(tmp_path, tiny_bert)],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
