"""The merged LoRA model is the trained model (issue 27 item 1): a LoRA on a tied input or output embedding is
merged with the embeddings untied, and every merge is checked against the adapter model's loss on a few rows."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

from leantrain.cli import main
from leantrain.config import resolve
from leantrain.engine import artifacts
from leantrain.errors import UserError
from leantrain.modeling.lora import apply_trainable
from leantrain.methods import get_task
from tests.helpers import TINY_LLAMA, lm_documents, make_tiny_lm_tokenizer

pytest.importorskip("peft")


def tied_llama_with_lora(*targets: str):
    """A tiny Llama whose lm_head shares the input embedding's weight, LoRA on ``targets``, the adapters moved off
    their zero start (as training does)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         tie_word_embeddings=True))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    cfg = resolve(None, ["peft.method=lora", "peft.r=4", "peft.dropout=0", f"peft.target_modules=[{','.join(targets)}]"])
    model, _ = apply_trainable(model, cfg.model, cfg.peft)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.2)
    return model


def rows_and_batch():
    ids = torch.randint(2, 96, (4, 12), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone(),
             "loss_weight": torch.ones(4)}
    task = get_task("causal-lm")
    data = SimpleNamespace(eval=list(range(4)), train=None, eval_collator=lambda rows: batch, collator=None,
                           task=SimpleNamespace(model=SimpleNamespace(merge_check_value=task.model.merge_check_value),
                                                data=SimpleNamespace(count=lambda rows, idx: 4 * 11)))
    return data, batch


@pytest.mark.parametrize("targets", [("embed_tokens",), ("lm_head",), ("embed_tokens", "lm_head", "q_proj")])
def test_a_lora_on_tied_embeddings_merges_into_the_trained_model(targets):
    model = tied_llama_with_lora(*targets)
    data, batch = rows_and_batch()
    model.eval()
    with torch.no_grad():
        adapted = model(input_ids=batch["input_ids"]).logits
    merged = artifacts._checked_merge(model, data)
    assert merged.lm_head.weight is not merged.model.embed_tokens.weight and not merged.config.tie_word_embeddings
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=batch["input_ids"]).logits, adapted, rtol=1e-4, atol=1e-4)


def test_the_merge_check_compares_in_the_weights_precision_after_a_mixed_precision_run(caplog):
    """A bf16-autocast run (this CPU's default): Accelerate leaves its autocast on the unwrapped model's forward, so
    the adapter model's loss was taken in bf16 and the merged model's in fp32, 0.8% apart on SmolLM2-135M: every
    such LoRA run exited 2. Both are now taken in the weights' own precision (fp32 here)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    try:
        accelerator = Accelerator(mixed_precision="bf16", cpu=True)
        model = accelerator.unwrap_model(accelerator.prepare(tied_llama_with_lora("q_proj", "v_proj")))
        data, batch = rows_and_batch()
        model.eval()
        with torch.no_grad():
            autocast = data.task.model.merge_check_value(model, batch).item() / 44
            exact = tied_llama_with_lora("q_proj", "v_proj").eval()(**{k: batch[k] for k in ("input_ids", "labels")})
        with caplog.at_level("INFO", logger="leantrain"):
            artifacts._checked_merge(model, data)
        merged, adapter = (float(x) for x in re.search(r"loss ([\d.]+) on 4 rows, as the adapter model's \(([\d.]+)\)",
                                                       caplog.text).groups())
        assert adapter == pytest.approx(exact.loss.item(), abs=2e-6) and merged == pytest.approx(adapter, rel=1e-4)
        assert abs(autocast - adapter) > 1e-5  # the autocast forward differs: the comparison above can tell
    finally:
        AcceleratorState._reset_state()


def test_a_merge_that_changes_the_model_is_refused(monkeypatch):
    """The check after every merge: peft's plain merge into the shared weight (what was saved before) is caught."""
    model = tied_llama_with_lora("embed_tokens")
    data, _ = rows_and_batch()
    monkeypatch.setattr(artifacts, "merged_for_saving", lambda m: m.merge_and_unload())
    with pytest.raises(UserError, match=r"the merged LoRA model is not the trained model: its loss on 4 rows is "):
        artifacts._checked_merge(model, data)


def test_train_then_eval_of_model_gives_the_runs_own_eval_loss(tmp_path):
    """End to end: `leantrain eval r/model` equals the run's final eval for a LoRA on the tied embed_tokens."""
    tok = make_tiny_lm_tokenizer(tmp_path / "tok")
    (tmp_path / "train.txt").write_text("\n\n".join(lm_documents(24, 0)))
    (tmp_path / "valid.txt").write_text("\n\n".join(lm_documents(8, 1)))
    out = tmp_path / "run"
    assert main(["train", *TINY_LLAMA, "model.config_overrides.tie_word_embeddings=true", f"model.tokenizer={tok}",
                 "model.task=causal-lm", f"data.train={tmp_path / 'train.txt'}", f"data.eval={tmp_path / 'valid.txt'}",
                 "data.block_size=16", "train.batch_size=4", "train.max_steps=3", "train.lr=5e-2", "peft.method=lora",
                 "peft.r=4", "peft.target_modules=[embed_tokens]", "report.plots=false", "report.progress=none",
                 f"data.cache_dir={tmp_path / 'cache'}", f"output_dir={out}"]) == 0
    run_eval = json.loads((out / "summary.json").read_text())["eval"]
    assert main(["eval", str(out / "model"), f"data.eval={tmp_path / 'valid.txt'}", "--output",
                 str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["eval"]["loss"] == pytest.approx(run_eval["loss"], rel=1e-5)
