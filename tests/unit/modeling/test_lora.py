"""LoRA through peft (leantrain.modeling.lora): target modules resolved per architecture, the head kept trainable,
every optimizer over the adapters only, gradient checkpointing and bf16 reach the adapters, the merged model equals
the adapted one, and the refusals (peft missing, unknown targets, qlora, FSDP) are exit-2 errors naming why."""

from __future__ import annotations

import sys

import pytest
import torch

from leantrain.config import resolve
from leantrain.errors import ConfigError, UserError
from leantrain.modeling.lora import apply_trainable, auto_target_modules, head_modules, short_names
from leantrain.modeling.switches import enable_checkpointing, is_checkpointing, set_checkpointing
from leantrain.optim import build_optimizer
from leantrain.optim.builders import BUILDERS
from leantrain.optim.state import state_tensors
from tests.tiny_models import tiny_bert_classifier, tiny_gpt2, tiny_llama

pytest.importorskip("peft")


def lora(model, *overrides: str):
    cfg = resolve(None, ["peft.method=lora", "peft.r=4", "peft.dropout=0", *overrides])
    return apply_trainable(model, cfg.model, cfg.peft)


def test_auto_targets_are_the_attention_and_mlp_projections_of_each_architecture():
    assert short_names(auto_target_modules(tiny_llama())) == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                              "up_proj", "down_proj"]
    assert short_names(auto_target_modules(tiny_gpt2())) == ["c_attn", "c_proj", "c_fc"]
    bert = auto_target_modules(tiny_bert_classifier())
    assert short_names(bert) == ["query", "key", "value", "dense"]
    assert not any("pooler" in n or "classifier" in n for n in bert)  # inside the layers only


def test_lora_trains_adapters_and_the_classifier_head_only():
    model, done = lora(tiny_bert_classifier())
    assert head_modules(model.get_base_model()) == ["classifier"]
    assert done.target_modules == ["query", "key", "value", "dense"] and done.modules_to_save == ["classifier"]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or "classifier.modules_to_save" in n for n in trainable)
    assert any("classifier" in n for n in trainable)
    assert done.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad) < done.total / 5
    ids = torch.randint(5, 100, (2, 7))
    loss = model(input_ids=ids, labels=torch.tensor([0, 2])).loss
    loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad and "lora_B" in n)


def test_causal_lm_keeps_the_tied_output_layer_frozen():
    model, done = lora(tiny_gpt2())
    assert done.modules_to_save == []  # lm_head is the (tied) output embedding, not a task head
    assert not model.get_base_model().lm_head.weight.requires_grad


def test_explicit_targets_and_an_unknown_one():
    model, done = lora(tiny_llama(), "peft.target_modules=[q_proj,v_proj]")
    assert done.target_modules == ["q_proj", "v_proj"]
    assert {n.split(".")[-3] for n, p in model.named_parameters() if p.requires_grad} == {"lora_A", "lora_B"}
    with pytest.raises(ConfigError, match="peft.target_modules") as e:
        lora(tiny_llama(), "peft.target_modules=[nope_proj]")
    assert "q_proj" in str(e.value)  # lists the Linear modules there are


def test_merged_model_computes_what_the_adapted_model_computes():
    model, _ = lora(tiny_bert_classifier())
    with torch.no_grad():  # move the adapters off their zero start
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    model.eval()
    ids = torch.randint(5, 100, (2, 7))
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        merged = model.merge_and_unload()
        assert type(merged).__name__ == "BertForSequenceClassification"
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_optimizer_keeps_state_for_the_trainable_parameters_only(name):
    if name == "lion":
        pytest.importorskip("lion_pytorch")
    if name == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    model, _ = lora(tiny_llama())
    cfg = resolve(None, [f"optim.name={name}"])
    opt = build_optimizer(model, cfg.optim, 1e-3)
    ids = torch.randint(0, 128, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    inner = getattr(opt, "optimizers", [opt])
    stated = {id(p) for o in inner for p in o.state}
    assert stated and stated <= trainable, name
    in_groups = {id(p) for o in inner for g in o.param_groups for p in g["params"]}
    assert in_groups == trainable, name
    assert sum(t.numel() for t in state_tensors(opt)) > 0


def test_gradient_checkpointing_reaches_the_adapters():
    model, _ = lora(tiny_llama())
    enable_checkpointing(model)
    ids = torch.randint(0, 128, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n and "layers.0." in n]  # A: zero grad while B is 0
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_lora_and_checkpointing_switches_print_no_deprecation_warning():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = lora(tiny_llama())
        assert not is_checkpointing(model)
        set_checkpointing(model, True)
        assert is_checkpointing(model)
        set_checkpointing(model, False)
        assert not is_checkpointing(model)
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]


def test_bf16_autocast_trains_fp32_adapters():
    model, _ = lora(tiny_llama())
    ids = torch.randint(0, 128, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    lora_params = [p for n, p in model.named_parameters() if "lora_" in n]
    assert all(p.dtype == torch.float32 and p.grad is not None for p in lora_params)


def test_missing_peft_exits_2_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(UserError, match=r"pip install 'leantrain\[peft\]'") as e:
        lora(tiny_bert_classifier())
    assert e.value.exit_code == 2


def test_qlora_and_fsdp_are_refused_before_any_model_with_the_reason(tmp_path):
    from leantrain.engine.setup.preflight import check_train

    cfg = resolve(None, ["peft.method=qlora", f"output_dir={tmp_path / 'run'}"])  # accepted at config time
    if not torch.cuda.is_available():  # the device decides: refused on CPU before any worker or model
        with pytest.raises(ConfigError, match="bitsandbytes.*peft.method=lora"):
            check_train(cfg)
    with pytest.raises(ConfigError, match="distributed.strategy=fsdp is not supported"):
        resolve(None, ["peft.method=lora", "distributed.strategy=fsdp"])


@pytest.mark.parametrize("name", ["adamw", "adafactor", "sgd", "muon"])
def test_planned_optimizer_state_of_a_lora_model_is_the_real_optimizers(name):
    from leantrain.optim.state import state_bytes
    from leantrain.perf.memory_model import meta_state_bytes

    model, _ = lora(tiny_llama())
    cfg = resolve(None, [f"optim.name={name}"]).optim
    opt = build_optimizer(model, cfg, 1e-3)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.randn_like(p)
    opt.step()
    assert meta_state_bytes(model, cfg) == state_bytes(opt) > 0


def test_an_adapter_only_over_a_model_built_from_a_config_is_refused_before_training(tmp_path, capsys):
    """peft.merge=false saves the adapter alone; over a model built from a config (random initial weights, saved
    nowhere) it could never be loaded again: exit 2 naming both keys, before any data, model or run folder."""
    from leantrain.cli import main
    from tests.helpers import TINY_LLAMA

    with pytest.raises(ConfigError, match=r"peft.merge=false on a model built from model.config.*peft.merge=true"):
        resolve(None, ["peft.method=lora", "peft.merge=false", "model.config_type=llama"])
    resolve(None, ["peft.method=lora", "model.config_type=llama"])  # merged (the default): the whole model is saved
    resolve(None, ["peft.method=lora", "peft.merge=false"])  # over a pretrained base: the adapter loads over it
    out = tmp_path / "run"
    assert main(["train", *TINY_LLAMA, "peft.method=lora", "peft.merge=false", "data.train=missing.jsonl",
                 f"output_dir={out}"]) == 2
    assert "peft.merge=false" in capsys.readouterr().err and not out.exists()
