"""A LoRA checkpoint holds the trainable state (adapters, saved buffers) and the base's identity, not the base: it
restores into a freshly built model, and a base whose weights changed is refused."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from leantrain.config import resolve
from leantrain.engine.checkpoint.resume import _load_model
from leantrain.engine.checkpoint.state_io import StateFormatError
from leantrain.modeling.lora import apply_trainable
from leantrain.modeling.trainable_state import identity, saves_trainable_only, trainable_state

pytest.importorskip("peft")


def lora_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))
    cfg = resolve(None, ["peft.method=lora", "peft.r=4"])
    return apply_trainable(model, cfg.model, cfg.peft)[0]


def test_lora_checkpoint_is_the_adapter_and_restores_into_a_fresh_model(tmp_path):
    model = lora_llama()
    assert saves_trainable_only(model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.5)  # trained adapters
    state = trainable_state(model)
    full = sum(p.numel() for p in model.parameters())
    assert state and all("lora_" in n for n in state) and sum(t.numel() for t in state.values()) < full / 5
    meta = identity(model, "tiny-llama")
    save_file(state, str(tmp_path / "model.safetensors"), metadata=meta)
    assert meta["base"] == "tiny-llama" and len(meta["base_fingerprint"]) == 64

    fresh = lora_llama()  # resume: the base built as at the start, the adapters from the checkpoint
    _load_model(tmp_path, fresh)
    now = dict(fresh.named_parameters())
    assert all(torch.equal(now[n], t) for n, t in state.items())

    other = lora_llama()
    with torch.no_grad():
        other.get_base_model().model.layers[0].mlp.up_proj.weight[0, 0] += 1  # the base folder changed since
    with pytest.raises(StateFormatError, match="frozen weights differ from the base loaded now"):
        _load_model(tmp_path, other)


def test_saved_buffers_of_a_frozen_base_are_in_the_trainable_state():
    """BatchNorm's running statistics move in train mode even when its module is frozen: they are kept."""
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    model[0].requires_grad_(False)
    state = trainable_state(model)
    assert set(state) == {"1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked"}
