"""model.attn_implementation: every branch of the pure decision, the model-class facts it reads from transformers,
auto on a CPU building the same model as before the key existed, and the implementations computing the same loss and
gradients (eager = SDPA on CPU; flash attention = SDPA on CUDA, gpu)."""

from __future__ import annotations

import pytest
import torch

from leantrain.config import resolve
from leantrain.errors import ConfigError
from leantrain.modeling.attention import (AttentionSupport, attention_support, choose_attention, flash_attn_usable,
                                         fp32_uses)
from leantrain.modeling.load import build_model
from leantrain.modeling.short_attention import NAME as SHORT_SDPA
from leantrain.methods import TEXT, get_task

LLAMA = AttentionSupport("LlamaForCausalLM", sdpa=True, flash=True)
NO_FLASH = AttentionSupport("SomeForCausalLM", sdpa=True, flash=False)
CONVNEXT = AttentionSupport("ConvNextForImageClassification", sdpa=False, flash=False)


def test_auto_every_branch():
    choice, why = choose_attention("auto", "cuda", "bf16", True, LLAMA)
    assert choice == "flash_attention_2" and "flash_attn installed" in why
    assert choose_attention("auto", "cuda", "fp16", True, LLAMA)[0] == "flash_attention_2"
    for args, missing in [(("mps", "fp32", True, LLAMA), "CUDA only"),  # what keeps flash attention out, said
                          (("cpu", "fp32", True, LLAMA), "CUDA only"),
                          (("cuda", "fp32", True, LLAMA), "bf16 / fp16 only"),
                          (("cuda", "bf16", False, LLAMA), "pip install flash-attn"),
                          (("cuda", "bf16", True, NO_FLASH), "SomeForCausalLM has no flash-attention"),
                          (("cuda", "bf16", True, LLAMA, ("report.sample_prompts",)), "outside autocast")]:
        choice, why = choose_attention("auto", *args)
        assert choice == "sdpa" and why.startswith("auto: PyTorch SDPA") and missing in why, args
    for precision in ("bf16", "fp16"):  # the CPU in half precision: SDPA with the short rows' matmul backward
        choice, why = choose_attention("auto", "cpu", precision, True, LLAMA)
        assert choice == SHORT_SDPA and why.startswith("auto: PyTorch SDPA") and f"slow in {precision}" in why
        assert "CUDA only" in why
    assert choose_attention("auto", "cpu", "bf16", False, CONVNEXT)[0] == "eager"
    choice, why = choose_attention("auto", "cpu", "fp32", False, CONVNEXT)
    assert choice == "eager" and "ConvNextForImageClassification has no SDPA" in why
    assert choose_attention("auto", "cuda", "bf16", True, None)[0] is None  # remote code: transformers decides


def test_explicit_values_are_kept_or_refused_naming_the_key():
    for device, precision, support in [("cpu", "fp32", CONVNEXT), ("cuda", "bf16", LLAMA), ("cpu", "bf16", None)]:
        assert choose_attention("eager", device, precision, False, support) == ("eager", "as configured")
    assert choose_attention("sdpa", "cpu", "fp32", False, LLAMA)[0] == "sdpa"
    assert choose_attention("sdpa", "cpu", "fp32", False, None)[0] == "sdpa"  # not known: transformers checks it
    with pytest.raises(ConfigError, match="model.attn_implementation=sdpa: ConvNextForImageClassification has no SDPA"):
        choose_attention("sdpa", "cuda", "bf16", True, CONVNEXT)
    assert choose_attention("flash_attention_2", "cuda", "bf16", True, LLAMA)[0] == "flash_attention_2"
    for args, missing in [(("cpu", "bf16", True, LLAMA), "CUDA only"), (("cuda", "fp32", True, LLAMA), "bf16 / fp16"),
                          (("cuda", "bf16", False, LLAMA), "pip install flash-attn"),
                          (("cuda", "bf16", True, NO_FLASH), "no flash-attention"),
                          (("cuda", "bf16", True, LLAMA, ("report.sample_prompts",)), "report.sample_prompts run")]:
        with pytest.raises(ConfigError, match=f"model.attn_implementation=flash_attention_2: .*{missing}"):
            choose_attention("flash_attention_2", *args)


def test_the_passes_outside_autocast_are_named():
    assert fp32_uses(resolve(None, [])) == ()
    assert fp32_uses(resolve(None, ["report.sample_prompts=[Once]", "peft.method=lora"])) == (
        "report.sample_prompts", "peft.method=lora (the merge check)")
    assert fp32_uses(resolve(None, ["peft.method=lora", "peft.merge=false"])) == ()


def test_the_model_class_facts_come_from_transformers():
    from transformers import (AutoModelForCausalLM, AutoModelForImageClassification, ConvNextConfig, LlamaConfig,
                              PretrainedConfig)

    assert attention_support(AutoModelForCausalLM, LlamaConfig()) == LLAMA
    assert attention_support(AutoModelForImageClassification, ConvNextConfig()) == CONVNEXT

    class RemoteConfig(PretrainedConfig):  # a config class no Auto mapping knows (remote code)
        model_type = "leantrain-remote"

    assert attention_support(AutoModelForCausalLM, RemoteConfig()) is None


def test_auto_on_cpu_builds_the_model_transformers_builds_by_default(tiny_bert):
    """The CPU run is unchanged by the key: auto resolves to SDPA, the implementation (and the weights, and the
    outputs, bitwise) of the model built without it."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    cfg = resolve(None, [f"model.name={tiny_bert}"]).model
    support = attention_support(AutoModelForSequenceClassification, AutoConfig.from_pretrained(tiny_bert))
    choice, _ = choose_attention(cfg.attn_implementation, "cpu", "fp32", flash_attn_usable(), support)
    assert choice == "sdpa"
    torch.manual_seed(0)
    before = build_model(cfg, ["a", "b"], get_task(TEXT))
    torch.manual_seed(0)
    now = build_model(cfg, ["a", "b"], get_task(TEXT), attention=choice)
    assert now.config._attn_implementation == before.config._attn_implementation == "sdpa"
    for (name, p), q in zip(now.state_dict().items(), before.state_dict().values()):
        assert torch.equal(p, q), name
    ids = torch.randint(5, 1000, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        assert torch.equal(now.eval()(input_ids=ids, attention_mask=mask).logits,
                           before.eval()(input_ids=ids, attention_mask=mask).logits)


def _llama(attention: str, device: str = "cpu", dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    return LlamaForCausalLM._from_config(cfg, attn_implementation=attention).to(device, dtype)


def _loss_and_grads(model, ids, mask):
    labels = ids.masked_fill(mask == 0, -100)
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _batch(device: str = "cpu"):
    ids = torch.randint(3, 128, (3, 17), generator=torch.Generator().manual_seed(1)).to(device)
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0  # right padding
    return ids, mask


def test_eager_and_sdpa_compute_the_same_loss_and_gradients():
    ids, mask = _batch()
    eager, sdpa = _llama("eager"), _llama("sdpa")
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    loss_e, grads_e = _loss_and_grads(eager, ids, mask)
    loss_s, grads_s = _loss_and_grads(sdpa, ids, mask)
    torch.testing.assert_close(loss_s, loss_e, rtol=1e-5, atol=1e-6)
    for name in grads_e:
        torch.testing.assert_close(grads_s[name], grads_e[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not flash_attn_usable(),
                    reason="needs a CUDA device and flash-attn (pip install flash-attn)")
def test_flash_attention_equals_sdpa_in_bf16():
    ids, mask = _batch("cuda")
    flash, sdpa = _llama("flash_attention_2", "cuda", torch.bfloat16), _llama("sdpa", "cuda", torch.bfloat16)
    loss_f, grads_f = _loss_and_grads(flash, ids, mask)
    loss_s, grads_s = _loss_and_grads(sdpa, ids, mask)
    torch.testing.assert_close(loss_f, loss_s, rtol=2e-2, atol=2e-2)  # bf16 rounding: two kernels, two orders
    for name in grads_s:
        torch.testing.assert_close(grads_f[name].float(), grads_s[name].float(), rtol=5e-2, atol=5e-3, msg=name)
