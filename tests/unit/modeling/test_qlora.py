"""QLoRA (leantrain.modeling.qlora) without CUDA: accepted at config time, refused before any model on a device
without bitsandbytes' 4-bit training (exit 2, the reason, peft.method=lora instead), the config-time refusals
(no pretrained weights, a precision other than bf16), the 4-bit load keywords, peft's kbit preparation + LoRA on a
model marked 4-bit, and the trainable-only checkpoint (a fake frozen Params4bit is never written)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from leantrain.config import resolve
from leantrain.errors import ConfigError, UserError
from leantrain.modeling import qlora
from leantrain.modeling.lora import apply_trainable

pytest.importorskip("peft")


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))


class Params4bit(nn.Parameter):
    """Stands in for bitsandbytes' packed 4-bit weight (found by its class name)."""


def test_qlora_on_cpu_exits_2_before_any_model_naming_lora(tmp_path, monkeypatch):
    import leantrain
    from leantrain.engine.training import loop

    def no_model(*a, **k):
        raise AssertionError("a model was built")

    monkeypatch.setattr(loop, "build_model", no_model)
    monkeypatch.setattr(loop, "device_type", lambda: "cpu")
    with pytest.raises(ConfigError, match=r"needs a CUDA device; this run's device is cpu: .*bitsandbytes 0\.50's "
                                          r"CPU backend.*Use peft\.method=lora") as e:
        leantrain.train(None, ["peft.method=qlora", f"output_dir={tmp_path / 'run'}"])
    assert e.value.exit_code == 2
    assert not (tmp_path / "run").exists()


def test_config_time_refusals_name_the_reason():
    resolve(None, ["peft.method=qlora"])  # accepted: the device is checked before the run starts
    with pytest.raises(ConfigError, match="nothing to quantise"):
        resolve(None, ["peft.method=qlora", "model.config_type=llama"])
    with pytest.raises(ConfigError, match="efficiency.precision=fp32 is not supported.*bf16"):
        resolve(None, ["peft.method=qlora", "efficiency.precision=fp32"])
    with pytest.raises(ConfigError, match="distributed.strategy=fsdp is not supported"):
        resolve(None, ["peft.method=qlora", "distributed.strategy=fsdp"])


def test_cuda_checks_bitsandbytes_and_bf16(monkeypatch):
    cfg = resolve(None, ["peft.method=qlora"])
    qlora.check_qlora(resolve(None, []), "cpu")  # other methods: nothing to check
    with pytest.raises(ConfigError, match="device is mps"):
        qlora.check_qlora(cfg, "mps")
    with pytest.raises(ConfigError, match="resolves to fp16.*bf16"):
        qlora.check_qlora(cfg, "cuda", "fp16")
    monkeypatch.setattr(qlora.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match="pip install bitsandbytes"):
        qlora.check_qlora(cfg, "cuda", "bf16")


def test_load_kwargs_are_nf4_double_quant_bf16_on_the_local_gpu():
    assert qlora.load_kwargs("lora", 0) == {}
    kw = qlora.load_kwargs("qlora", 3)
    bnb = kw["quantization_config"]
    assert bnb.load_in_4bit and bnb.bnb_4bit_quant_type == "nf4" and bnb.bnb_4bit_use_double_quant
    assert bnb.bnb_4bit_compute_dtype == torch.bfloat16
    assert kw["device_map"] == {"": 3} and kw["dtype"] == torch.bfloat16


def test_qlora_on_a_model_not_loaded_4bit_is_refused():
    cfg = resolve(None, ["peft.method=qlora"])
    with pytest.raises(ConfigError, match="needs the base loaded 4-bit.*leantrain plan"):
        apply_trainable(tiny_llama(), cfg.model, cfg.peft)


def test_qlora_prepares_the_4bit_model_then_applies_lora():
    cfg = resolve(None, ["peft.method=qlora", "peft.r=4"])
    model = tiny_llama().to(torch.bfloat16)
    model.is_loaded_in_4bit = True  # what transformers' bitsandbytes quantizer marks
    model, done = apply_trainable(model, cfg.model, cfg.peft)
    record = done.record(cfg.peft)
    assert record["method"] == "qlora" and record["quantization"]["quant_type"] == "nf4"
    assert record["quantization"]["double_quant"] and record["quantization"]["compute_dtype"] == "bfloat16"
    assert record["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # prepare_model_for_kbit_training casts the non-4-bit weights (norms, embeddings) to fp32
    assert model.get_input_embeddings().weight.dtype == torch.float32


def test_checkpoint_holds_the_trainable_tensors_only_and_restores_them(tmp_path):
    from safetensors.torch import save_file

    from leantrain.engine.checkpoint.resume import _load_model
    from leantrain.modeling.trainable_state import CHECKPOINT_KIND, load_trainable_state, trainable_state

    cfg = resolve(None, ["peft.method=lora", "peft.r=4"])
    model, _ = apply_trainable(tiny_llama(), cfg.model, cfg.peft)
    base = model.get_base_model()
    base.model.packed = Params4bit(torch.zeros(8, dtype=torch.uint8), requires_grad=False)  # a frozen 4-bit weight
    assert qlora.is_quantized(model)
    state = trainable_state(model)
    assert state and all("lora_" in n for n in state) and not any("packed" in n for n in state)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"leantrain": CHECKPOINT_KIND})
    saved = {n: t.clone() for n, t in state.items()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.add_(1.0)
    _load_model(tmp_path, model)  # resume: the trainable tensors back, the base untouched
    now = dict(model.named_parameters())
    assert all(torch.equal(now[n], t) for n, t in saved.items())
    missing, unexpected = load_trainable_state(model, {"nope": torch.zeros(1)})
    assert missing and unexpected == ["nope"]


def test_a_packed_4bit_weight_counts_the_values_of_its_original_shape():
    from types import SimpleNamespace

    from leantrain.modeling import parameter_counts

    model = nn.Sequential(nn.Linear(4, 4, bias=False))
    plain = parameter_counts(model)["total"]
    packed = Params4bit(torch.zeros(32, 1, dtype=torch.uint8), requires_grad=False)  # 64 values, 2 per byte
    packed.quant_state = SimpleNamespace(shape=torch.Size([8, 8]))
    model[0].packed = packed
    assert parameter_counts(model)["total"] == plain + 64
