"""Weights are loaded in fp32 whatever the checkpoint holds (leantrain.modeling.load.WEIGHTS_DTYPE): transformers 5
keeps a bf16 checkpoint in bf16, which would make a fine-tune update bf16 weights (AdamW's small steps round away)
and eval / predict compute in bf16."""

from __future__ import annotations

import torch

from leantrain.config import resolve
from leantrain.modeling import build_model, load_trained_model
from leantrain.methods import get_task
from leantrain.optim import build_optimizer
from tests.helpers import make_tiny_llama, make_tiny_lm_tokenizer


def bf16_checkpoint(tmp_path):
    folder = make_tiny_llama(tmp_path / "fp32", make_tiny_lm_tokenizer(tmp_path / "tok"))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16", safe_serialization=True)
    return tmp_path / "bf16", {n: p.detach().clone() for n, p in model.named_parameters()}


def test_a_bf16_checkpoint_trains_fp32_master_weights(tmp_path):
    folder, stored = bf16_checkpoint(tmp_path)
    cfg = resolve(None, [f"model.name={folder}", "model.task=causal-lm"])
    model = build_model(cfg.model, [], get_task("causal-lm"))
    params = dict(model.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.float32}
    assert all(torch.equal(params[n], stored[n].float()) for n in stored)  # the checkpoint's values, exactly
    optimizer = build_optimizer(model, cfg.optim, lr=1e-3)
    model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    optimizer.step()
    moments = [t for st in optimizer.state.values() for k, t in st.items() if k in ("exp_avg", "exp_avg_sq")]
    assert len(moments) == 2 * len(params) and {t.dtype for t in moments} == {torch.float32}


def test_eval_and_predict_load_a_bf16_checkpoint_in_fp32(tmp_path):
    folder, _ = bf16_checkpoint(tmp_path)
    model = load_trained_model(str(folder), get_task("causal-lm"), resolve(None, []).model)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_the_fine_tune_of_a_bf16_checkpoint_is_saved_in_bf16_unless_float32_is_asked(tmp_path):
    import json

    from safetensors import safe_open

    from leantrain.engine.training.loop import train
    from tests.helpers import lm_documents

    import shutil

    folder, _ = bf16_checkpoint(tmp_path)
    for f in (tmp_path / "tok").iterdir():  # the checkpoint with its tokenizer, as a Hub folder has it
        shutil.copy(f, folder / f.name)
    (tmp_path / "train.txt").write_text("\n\n".join(lm_documents(20, 0)))
    base = [f"model.name={folder}", "model.task=causal-lm", f"data.train={tmp_path / 'train.txt'}",
            "data.block_size=16", "train.batch_size=2", "train.max_steps=1", "checkpoint.every_steps=0",
            "report.plots=false"]
    for save, dtype in (("auto", "bfloat16"), ("float32", "float32")):
        out = tmp_path / save
        train(resolve(None, [*base, f"model.save_dtype={save}", f"output_dir={out}"]))
        with safe_open(str(out / "model" / "model.safetensors"), "pt") as f:
            assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16" if save == "auto" else "F32"}
        assert json.loads((out / "model" / "config.json").read_text())["dtype"] == dtype
        reloaded = load_trained_model(str(out / "model"), get_task("causal-lm"), resolve(None, []).model)
        assert {p.dtype for p in reloaded.parameters()} == {torch.float32}  # eval / predict still compute in fp32
