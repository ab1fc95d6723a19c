"""The fast decode step computes transformers' forward of one token per row on a reserved cache: the same logits and
cache entries (fp32 to 1e-5; under bf16 autocast as close to the fp32 logits as transformers' own), for Llama (tied,
grouped-query; untied with biases and llama3 RoPE), Qwen2 (q/k/v biases) and Mistral; anything else is left to
transformers' forward."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from leantrain.modeling.generation import fast_decode
from leantrain.modeling.generation.reserved_cache import reserve
from tests.tiny_models import loss_llama, tiny_gpt2

G, NEW = 3, 4
SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def llama_with_biases():
    torch.manual_seed(1)
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    return LlamaForCausalLM(LlamaConfig(**SMALL, attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
                                        rope_parameters=rope))


def qwen2():
    torch.manual_seed(2)
    return Qwen2ForCausalLM(Qwen2Config(**SMALL))


def mistral(window=None):
    torch.manual_seed(3)
    return MistralForCausalLM(MistralConfig(**SMALL, sliding_window=window))


def lora_llama(**config):
    """A peft LoRA Llama whose adapters are not zero (B random, as after training), on every projection and the
    output layer; the transformers model inside peft's wrapper, its linears LoRA layers."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(4)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False, **config)
    return get_peft_model(llama_with_biases(), lora).base_model.model


MODELS = {"llama": loss_llama, "llama-biases-llama3-rope": llama_with_biases, "qwen2": qwen2, "mistral": mistral,
          "llama-lora": lora_llama}


def prefilled(model, autocast: bool | str):
    """``autocast``: False, True (around everything) or "forward" (around the model's forward alone, as Accelerate's
    mixed precision wraps it). The reserved cache of two left-padded prompts (lengths 3 and 5), each repeated G times, with room for NEW
    tokens; the mask and the next positions."""
    ids = torch.tensor([[0, 0, 5, 6, 7], [9, 10, 11, 12, 13]])
    mask = (ids != 0).long()
    if autocast == "forward" and not hasattr(model, "plain_forward"):
        model.plain_forward = model.forward
        model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast is True):
        cache = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                      use_cache=True).cache
        reserve(cache, G, capacity=ids.shape[1] + NEW)  # in the dtype attention reads
    mask = mask.repeat_interleave(G, 0)
    return cache, torch.cat([mask, mask.new_ones(mask.shape[0], NEW)], 1), mask.sum(-1, keepdim=True)


def decoded(model, fast: bool, autocast: bool | str):
    """The fp32 logits of NEW fixed tokens, and the cache after them, by the decoder or transformers' forward."""
    model.eval()
    cache, mask, position = prefilled(model, autocast)
    prompt, out = mask.shape[1] - NEW, []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast is True):
        step = fast_decode.decoder(model, cache) if fast else None
        assert (step is not None) == fast
        for t in range(NEW):
            token = torch.arange(G * 2) + 20 + 7 * t
            m = mask[:, :prompt + t + 1]
            if fast:
                out.append(step(token, position + t, m))
            else:
                out.append(model(input_ids=token[:, None], attention_mask=m, position_ids=position + t, cache=cache,
                                 use_cache=True).logits[:, -1].float())
    if hasattr(model, "plain_forward"):
        model.forward = model.__dict__.pop("plain_forward")
    return torch.stack(out), cache


@pytest.mark.parametrize("name", list(MODELS))
def test_the_decoder_is_transformers_forward_in_fp32(name):
    model = MODELS[name]()
    (fast, fast_cache), (plain, plain_cache) = decoded(model, True, False), decoded(model, False, False)
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-5)
    for a, b in zip(fast_cache.layers, plain_cache.layers):
        assert a.keys.shape == b.keys.shape
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("autocast", [True, "forward"], ids=["around-all", "around-forward"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_under_bf16_autocast_it_is_as_close_to_fp32_as_transformers_own(name, autocast):
    model = MODELS[name]()
    reference, _ = decoded(model, False, False)
    (fast, fast_cache), (plain, _) = decoded(model, True, autocast), decoded(model, False, autocast)
    assert fast_cache.layers[0].keys.dtype == torch.bfloat16
    own, ours = (plain - reference).abs().max(), (fast - reference).abs().max()
    assert 0 < own and ours <= 2 * own + 1e-3, (ours, own)
    assert (fast - plain).abs().max() <= 2 * own + 1e-3


def test_it_drops_the_prefills_weight_casts_and_leaves_the_weights_alone():
    model = loss_llama().eval()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cache, mask, position = prefilled(model, True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        step = fast_decode.decoder(model, cache)
        assert step.dtype == torch.bfloat16 and step.layers[0][1][0].dtype == torch.bfloat16
        logits = step(torch.arange(G * 2), position, mask[:, :mask.shape[1] - NEW + 1])
    assert logits.dtype == torch.float32 and logits.shape == (G * 2, model.config.vocab_size)
    assert cache.get_seq_length() == mask.shape[1] - NEW + 1  # the token's keys and values were written
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_lora_adapters_are_folded_into_the_copies_and_peft_wrappers_are_taken():
    from peft import LoraConfig, get_peft_model

    model = lora_llama()
    assert fast_decode.decoder(model.eval(), prefilled(model, False)[0]) is not None
    wrapped = get_peft_model(loss_llama(), LoraConfig(r=2, target_modules=["q_proj"]))  # peft's own model
    assert fast_decode.refusal(wrapped) is None and fast_decode.copied_bytes(wrapped, torch.float32) > 0
    with wrapped.disable_adapter():  # switched off: its forward is the base model's, the copies would not be
        assert fast_decode.refusal(wrapped) is not None


def test_anything_else_keeps_transformers_forward():
    cache, _, _ = prefilled(loss_llama().eval(), False)
    assert fast_decode.decoder(tiny_gpt2().eval(), cache) is None  # another architecture
    assert fast_decode.decoder(mistral(window=4).eval(), prefilled(mistral(window=4).eval(), False)[0]) is None
    for other in (lora_llama(use_dora=True), embedding_lora()):  # DoRA; an adapted embedding
        assert fast_decode.decoder(other.eval(), prefilled(other, False)[0]) is None
    growing = loss_llama().eval()
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        grown = growing(input_ids=ids, use_cache=True).cache  # not reserved
    assert fast_decode.decoder(growing, grown) is None
    assert fast_decode.decoder(growing, prefilled(growing, False)[0]) is not None


def embedding_lora():
    from peft import LoraConfig, get_peft_model

    return get_peft_model(loss_llama(), LoraConfig(r=2, target_modules=["embed_tokens", "q_proj"])).base_model.model
