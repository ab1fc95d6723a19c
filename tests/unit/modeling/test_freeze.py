"""model.freeze without LoRA (leantrain.modeling.lora.freeze): patterns over parameter names with ranges and
``embeddings``, what was frozen and the trainable count, an unmatched pattern an exit-2 error naming it and the
model's modules, and the optimizer over the trainable parameters only."""

from __future__ import annotations

import logging

import pytest
import torch

from leantrain.config import resolve
from leantrain.errors import ConfigError
from leantrain.modeling.lora import apply_trainable, pattern_regex
from leantrain.optim import build_optimizer
from tests.tiny_models import tiny_bert_classifier, tiny_gpt2, tiny_llama


def frozen_by(model, *patterns: str, caplog=None):
    cfg = resolve(None, ["model.freeze=[" + ",".join(patterns) + "]"])
    return apply_trainable(model, cfg.model, cfg.peft)


def test_pattern_ranges_match_whole_parts_only():
    rx = pattern_regex("encoder.layer.0-3")
    assert rx.search("bert.encoder.layer.0.attention.self.query.weight")
    assert rx.search("bert.encoder.layer.3.output.dense.bias")
    assert not rx.search("bert.encoder.layer.4.output.dense.bias")
    assert not rx.search("bert.encoder.layer.10.output.dense.bias")  # 1 of 10 is no match
    assert pattern_regex("layers.*.mlp").search("model.layers.5.mlp.up_proj.weight")
    with pytest.raises(ConfigError, match="empty"):
        pattern_regex("layers.3-1")


def test_freeze_bert_embeddings_and_lower_layers(caplog):
    caplog.set_level(logging.INFO, logger="leantrain")
    model, done = frozen_by(tiny_bert_classifier(layers=4), "embeddings", "encoder.layer.0-1")
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert {n for n in frozen if not n.startswith("bert.embeddings.")} == {
        n for n, _ in model.named_parameters() if n.startswith(("bert.encoder.layer.0.", "bert.encoder.layer.1."))}
    assert any(n.startswith("bert.embeddings.LayerNorm") for n in frozen)  # the whole embeddings module
    assert all(p.requires_grad for n, p in model.named_parameters() if "layer.2." in n or "classifier" in n)
    assert set(done.frozen) == {"embeddings", "encoder.layer.0-1"}
    assert done.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert "frozen: embeddings" in caplog.text and f"trainable: {done.trainable:,} of {done.total:,}" in caplog.text
    opt = build_optimizer(model, resolve(None, []).optim, 1e-3)
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == done.trainable


def test_freeze_a_causal_lm():
    model, done = frozen_by(tiny_llama(), "embeddings", "model.layers.0-0")
    assert not model.model.embed_tokens.weight.requires_grad  # embeddings = the input embeddings of any model
    assert not any(p.requires_grad for p in model.model.layers[0].parameters())
    assert all(p.requires_grad for p in model.model.layers[1].parameters())
    ids = torch.randint(0, 128, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad is None
    assert model.model.layers[1].self_attn.q_proj.weight.grad is not None
    gpt2, _ = frozen_by(tiny_gpt2(), "embeddings")
    assert not gpt2.transformer.wte.weight.requires_grad


def test_an_unmatched_pattern_names_itself_and_the_modules():
    with pytest.raises(ConfigError) as e:
        frozen_by(tiny_bert_classifier(), "encoder.layers.0")
    text = str(e.value)
    assert "'encoder.layers.0' matches no parameter" in text and e.value.exit_code == 2
    assert "bert.encoder" in text and "classifier" in text


def test_freezing_everything_is_refused():
    with pytest.raises(ConfigError, match="no trainable parameter"):
        frozen_by(tiny_bert_classifier(), "bert", "classifier")
