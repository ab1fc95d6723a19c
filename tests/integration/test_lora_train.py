"""LoRA runs end to end through `leantrain train` with a tiny random BERT classifier: the adapter folder and the
merged model (which loads with pipeline() in a process where peft cannot be imported), adapter-only saving,
a bitwise kill-and-resume (2 processes equal to 1, and freezing under FSDP on 2 processes: test_tasks_distributed.py,
in its one launch)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import (cli_here, make_tiny_bert, model_params, resume_args, resume_data, run_train_process,
                           train_here, trajectory)

pytest.importorskip("peft")
LORA = ["peft.method=lora", "peft.r=4", "peft.alpha=8"]
NO_PEFT = """
import sys
sys.modules["peft"] = None  # `import peft` raises ImportError from here on
from transformers import pipeline
out = pipeline("text-classification", model=sys.argv[1])("good fine great")
try:
    import peft
    print("peft importable")
except ImportError:
    print("no peft", out[0]["label"])
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    make_tiny_bert(root / "bert", dropout=0.1, layers=1, hidden=16)
    return root


@pytest.fixture(scope="module")
def lora_run(root) -> tuple[Path, str]:
    """One uninterrupted LoRA run (checkpoints every 2 steps, merged at the end), in this process: its folder and
    what it wrote to stderr. The merged-model test reads it and the kill-and-resume test compares against it."""
    folder = resume_data(root, "ref")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        train_here(resume_args(folder, *LORA))
    return folder, err.getvalue()


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_lora_saves_the_adapter_and_a_merged_model_that_loads_without_peft(lora_run):
    folder, stderr = lora_run
    assert "LoRA: r=4 alpha=8 dropout=0.05 on query, key, value, dense; trained in full: classifier" in stderr
    run = folder / "run"
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((run / "adapter" / "adapter_config.json").read_text())["r"] == 4
    params = model_params(run)
    assert not any("lora_" in k or "base_model" in k for k in params)  # a plain BERT state dict
    s = _summary(run)
    m = s["model"]
    assert 0 < m["trainable_parameters"] < m["total_parameters"] / 10
    assert m["peft"]["target_modules"] == ["query", "key", "value", "dense"] and m["peft"]["merged"] is True
    assert s["optim"]["parameters"] == m["trainable_parameters"]
    assert s["optim"]["state_bytes"] == pytest.approx(8 * m["trainable_parameters"], rel=0.05)  # AdamW: 2 moments
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", NO_PEFT, str(run / "model")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.startswith("no peft ") and p.stdout.split()[-1] in ("neg", "pos")


def test_adapter_only_run_says_how_to_load_it(root):
    from peft import PeftModel
    from transformers import AutoConfig, BertForSequenceClassification

    folder = resume_data(root, "adapter")
    r = cli_here("train", *resume_args(folder, *LORA, "peft.merge=false", "checkpoint.every_steps=0"))
    assert r.returncode == 0, r.stderr[-3000:]
    run = folder / "run"
    assert not (run / "model").exists()
    assert "adapter only (peft.merge=false): leantrain eval / predict / generate load it over its base" in r.stderr
    adapter = run / "adapter"
    assert f"peft.PeftModel.from_pretrained(transformers.BertForSequenceClassification.from_pretrained('{root / 'bert'}'"\
           f", config=transformers.AutoConfig.from_pretrained('{adapter}')), '{adapter}')" in r.stderr
    model = PeftModel.from_pretrained(BertForSequenceClassification.from_pretrained(
        root / "bert", config=AutoConfig.from_pretrained(adapter)), adapter)
    assert model.config.id2label == {0: "neg", 1: "pos"}
    summary = _summary(run)
    model.eval()
    from transformers import pipeline

    preds = pipeline("text-classification", model=model.merge_and_unload(),
                     tokenizer=str(adapter))(["good fine", "bad poor"])
    assert {p["label"] for p in preds} <= {"neg", "pos"} and summary["model"]["peft"]["merged"] is False


@pytest.mark.slow
def test_lora_kill_and_resume_is_bitwise(root, lora_run):
    """Dropout on (the model's and LoRA's): the checkpoint must hold the adapter, optimizer and RNG states."""
    ref, resumed = lora_run[0], resume_data(root, "resumed")
    killed = run_train_process(resumed, *LORA, env={"LEANTRAIN_TEST_KILL_AT_STEP": "5"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    final = cli_here("train", *resume_args(resumed, *LORA))  # resumed in this process
    assert final.returncode == 0, final.stderr[-3000:]
    assert "resuming from" in final.stderr and "step-0000004" in final.stderr
    assert trajectory(resumed / "run") == trajectory(ref / "run")
    a, b = model_params(ref / "run"), model_params(resumed / "run")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("adapter_model.safetensors",):
        assert (ref / "run" / "adapter" / name).read_bytes() == (resumed / "run" / "adapter" / name).read_bytes()
    from safetensors import safe_open

    with safe_open(str(ref / "run" / "checkpoints" / "step-0000006" / "model.safetensors"), "pt") as f:
        keys, meta = list(f.keys()), f.metadata()  # the adapter and the head, not the frozen base
    assert meta["leantrain"] == "trainable-only" and meta["base"] == str(root / "bert") and meta["base_fingerprint"]
    assert keys and all("lora_" in k or "modules_to_save" in k for k in keys), keys


def test_causal_lm_lora_through_train_merges_into_a_plain_llama(tmp_path):
    """A tiny Llama (from a config, 2 layers) with LoRA on q..down_proj and the chunked loss on: only the adapters
    train, the tied output layer stays frozen, sample continuations come from the adapted model, and model/ is a
    plain LlamaForCausalLM that pipeline("text-generation") loads without peft."""
    from tests.helpers import TINY_LLAMA, lm_documents, make_tiny_lm_tokenizer

    from leantrain import train

    tok = make_tiny_lm_tokenizer(tmp_path / "tok")
    (tmp_path / "train.txt").write_text("\n\n".join(lm_documents(24, 0)))
    (tmp_path / "valid.txt").write_text("\n\n".join(lm_documents(8, 1)))
    summary = train(None, [*TINY_LLAMA, f"model.tokenizer={tok}", "model.task=causal-lm",
                           f"data.train={tmp_path / 'train.txt'}", f"data.eval={tmp_path / 'valid.txt'}",
                           "data.block_size=16", "train.batch_size=4", "train.max_steps=3", "train.lr=1e-2",
                           "efficiency.chunked_loss=true", "report.sample_prompts=[ba be]",
                           "report.sample_max_new_tokens=2", "report.plots=false", "report.progress=none",
                           *LORA, f"output_dir={tmp_path / 'run'}"])
    peft_record = summary["model"]["peft"]
    assert peft_record["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"]
    assert peft_record["modules_to_save"] == [] and summary["eval"]["loss"] > 0
    assert summary["optim"]["parameters"] == summary["model"]["trainable_parameters"] < \
        summary["model"]["total_parameters"] / 2
    run_dir = tmp_path / "run"
    assert json.loads((run_dir / "model" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    code = NO_PEFT.replace('"text-classification"', '"text-generation"').replace(
        '("good fine great")', '("ba be", max_new_tokens=2)').replace('out[0]["label"]', '"ok"')
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", code, str(run_dir / "model")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "no peft ok"
