"""QLoRA's leantrain glue on CPU, with bitsandbytes stood in for: the model is marked 4-bit (transformers'
``is_loaded_in_4bit``) instead of being quantised, so peft's kbit preparation, the LoRA, the trainable-only
checkpoint, the resume from it and the merged model/ (the base reloaded bf16, the adapter merged) all run here.
The real 4-bit load runs in tests/integration/test_qlora_gpu.py (CUDA only)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import lm_documents, make_tiny_llama, make_tiny_lm_tokenizer

pytest.importorskip("peft")


@pytest.fixture
def marked_4bit(monkeypatch):
    from leantrain.engine.setup import preflight
    from leantrain.engine.training import loop

    build = loop.build_model

    def build_marked(*args, **kwargs):
        model = build(*args, **kwargs)
        model.is_loaded_in_4bit = True  # what transformers' bitsandbytes quantizer marks
        return model

    monkeypatch.setattr(loop, "check_qlora_precision", lambda *a, **k: None)
    monkeypatch.setattr(preflight, "check_qlora", lambda *a, **k: None)
    monkeypatch.setattr(loop, "qlora_load_kwargs", lambda *a, **k: {})
    monkeypatch.setattr(loop, "build_model", build_marked)


@pytest.mark.slow
def test_qlora_glue_checkpoints_resumes_and_merges_into_a_bf16_base(tmp_path, marked_4bit):
    from safetensors import safe_open
    from safetensors.torch import load_file

    from leantrain import train
    from leantrain.report.logs import read_metrics

    make_tiny_llama(tmp_path / "llama", make_tiny_lm_tokenizer(tmp_path / "tok"))
    (tmp_path / "train.txt").write_text("\n\n".join(lm_documents(24, 0)))

    def args(out, *extra):
        return [f"model.name={tmp_path / 'llama'}", "model.task=causal-lm", f"data.train={tmp_path / 'train.txt'}",
                "data.block_size=16", "train.batch_size=4", "train.max_steps=4", "train.lr=1e-2",
                "train.log_every_steps=1", "peft.method=qlora", "peft.r=4", "peft.dropout=0.0",
                "checkpoint.every_steps=2", "report.plots=false", "report.progress=none", f"output_dir={out}", *extra]

    summary = train(None, args(tmp_path / "run"))
    assert summary["model"]["peft"]["method"] == "qlora" and summary["model"]["peft"]["quantization"]["bits"] == 4
    with safe_open(str(tmp_path / "run" / "checkpoints" / "step-0000002" / "model.safetensors"), "pt") as f:
        assert f.metadata()["leantrain"] == "trainable-only" and all("lora_" in k for k in f.keys())
    resumed = train(None, args(tmp_path / "resumed",
                               f"checkpoint.resume={tmp_path / 'run' / 'checkpoints' / 'step-0000002'}"))
    assert resumed["train"]["resumed_from_step"] == 2

    def losses(run):
        return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if r.get("type") == "train"}

    first, again = losses(tmp_path / "run"), losses(tmp_path / "resumed")
    assert again[3] == first[3] and again[4] == first[4]
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    merged, base = load_file(str(tmp_path / "run" / "model" / "model.safetensors")), \
        load_file(str(tmp_path / "llama" / "model.safetensors"))
    assert merged.keys() == base.keys() and all(t.dtype == torch.bfloat16 for t in merged.values())
    key = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[key], base[key].to(torch.bfloat16))  # the adapter is merged in
    key = "model.layers.0.input_layernorm.weight"
    assert torch.equal(merged[key], base[key].to(torch.bfloat16))  # the frozen base is the pretrained one
