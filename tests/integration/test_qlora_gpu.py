"""QLoRA (peft.method=qlora) end to end on CUDA: a tiny pretrained Llama (hidden 128, intermediate 256, 2 layers, a
~240-word vocabulary built here) loaded 4-bit NF4 through bitsandbytes, trained through `leantrain.train`; the
checkpoint holds the adapter tensors only and a resume from it continues the run; the merged model/ is a plain bf16
LlamaForCausalLM that pipeline("text-generation") loads in a process where peft and bitsandbytes cannot be imported.
Skipped without CUDA (CI has no GPU): run `pytest -m gpu` on a GPU machine. Needs no ../shared data."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import lm_documents, make_tiny_llama, make_tiny_lm_tokenizer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

NO_PEFT_NO_BNB = """
import sys
sys.modules["peft"] = None  # `import peft` / `import bitsandbytes` raise ImportError from here on
sys.modules["bitsandbytes"] = None
from transformers import pipeline
out = pipeline("text-generation", model=sys.argv[1], device="cpu")("ba be", max_new_tokens=3, do_sample=False)
print("generated", type(out[0]["generated_text"]).__name__)
"""


def _args(root: Path, out: Path, *extra: str) -> list[str]:
    return [f"model.name={root / 'llama'}", "model.task=causal-lm", f"data.train={root / 'train.txt'}",
            "data.block_size=16", "train.batch_size=4", "train.max_steps=4", "train.lr=1e-2", "train.log_every_steps=1",
            "efficiency.precision=bf16", "peft.method=qlora", "peft.r=4", "peft.alpha=8", "peft.dropout=0.0",
            "checkpoint.every_steps=2", "report.plots=false", "report.progress=none", f"output_dir={out}", *extra]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    from leantrain import train

    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    root = tmp_path_factory.mktemp("qlora")
    make_tiny_llama(root / "llama", make_tiny_lm_tokenizer(root / "tok"), layers=2, hidden=128)
    (root / "train.txt").write_text("\n\n".join(lm_documents(48, 0)))
    summary = train(None, _args(root, root / "run"))
    return root, summary


def _losses(run: Path) -> dict[int, float]:
    from leantrain.report.logs import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if r.get("type") == "train"}


def test_qlora_trains_4bit_and_saves_a_plain_merged_model(first_run):
    from safetensors import safe_open
    from safetensors.torch import load_file

    root, summary = first_run
    run = root / "run"
    peft_record = summary["model"]["peft"]
    assert peft_record["method"] == "qlora" and summary["device"]["type"] == "cuda"
    q = peft_record["quantization"]
    assert (q["bits"], q["quant_type"], q["double_quant"], q["compute_dtype"]) == (4, "nf4", True, "bfloat16")
    assert peft_record["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"]
    assert math.isfinite(summary["train"]["final_loss"]) and 0 < summary["model"]["trainable_parameters"]
    # the checkpoint: the trainable (adapter) tensors only, no 4-bit base
    ckpt = run / "checkpoints" / "step-0000002" / "model.safetensors"
    with safe_open(str(ckpt), "pt") as f:
        assert f.metadata()["leantrain"] == "trainable-only"
        assert f.keys() and all("lora_" in k for k in f.keys())
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    # model/: a plain bf16 Llama, the adapter merged in (q_proj moved from the base), no quantisation config
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    merged, base = load_file(str(run / "model" / "model.safetensors")), load_file(str(root / "llama" /
                                                                                       "model.safetensors"))
    assert not any("lora_" in k or "absmax" in k or "quant" in k for k in merged)
    assert all(t.dtype == torch.bfloat16 for t in merged.values())
    key = "model.layers.0.self_attn.q_proj.weight"
    assert merged[key].shape == base[key].shape and not torch.equal(merged[key], base[key].to(torch.bfloat16))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run([sys.executable, "-c", NO_PEFT_NO_BNB, str(run / "model")], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("generated str")


def test_qlora_resumes_from_its_trainable_only_checkpoint(first_run):
    from leantrain import train

    root, summary = first_run
    out = root / "resumed"
    resumed = train(None, _args(root, out, f"checkpoint.resume={root / 'run' / 'checkpoints' / 'step-0000002'}"))
    assert resumed["train"]["resumed_from_step"] == 2 and resumed["train"]["steps"] == 4
    first, again = _losses(root / "run"), _losses(out)
    assert set(again) >= {3, 4}
    for step in (3, 4):  # the adapter, optimizer and RNG came back: the same steps after the resume point
        assert again[step] == pytest.approx(first[step], rel=1e-3, abs=1e-4)
