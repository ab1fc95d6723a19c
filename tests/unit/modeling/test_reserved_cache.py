"""The reserved KV cache: decoding on it is decoding on transformers' growing cache, bit for bit, in fp32 and under
bf16 autocast (where it keeps the keys in bf16); its room is checked; other caches are only repeated."""

import pytest
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from leantrain.modeling.generation.reserved_cache import ReservedLayer, reserve
from tests.tiny_models import loss_llama, tiny_gpt2

G, NEW = 3, 4


def prompts():
    """Two left-padded prompts of lengths 3 and 5."""
    ids = torch.tensor([[0, 0, 5, 6, 7], [9, 10, 11, 12, 13]])
    return ids, (ids != 0).long()


def decoded_logits(model, reserved: bool, autocast: bool) -> list[torch.Tensor]:
    """The logits of NEW fixed tokens decoded after the prompts' prefill, each prompt's row repeated G times."""
    ids, mask = prompts()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    use_cache=True)
        cache = out.cache
        if reserved:
            reserve(cache, G, capacity=ids.shape[1] + NEW)
        else:
            cache.batch_repeat_interleave(G)
        mask = mask.repeat_interleave(G, 0)
        position, logits = mask.sum(-1, keepdim=True), []
        for step in range(NEW):
            token = torch.arange(G * 2)[:, None] + 20 + step
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            out = model(input_ids=token, attention_mask=mask, position_ids=position + step, cache=cache,
                        use_cache=True)
            logits.append(out.logits)
    if reserved:
        assert all(type(layer) is ReservedLayer for layer in cache.layers)
        assert cache.get_seq_length() == ids.shape[1] + NEW
    return logits


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_decoding_on_the_reserved_cache_is_decoding_on_a_growing_one(name, autocast):
    model = {"llama": loss_llama, "gpt2": tiny_gpt2}[name]().eval()
    grown, reserved = decoded_logits(model, False, autocast), decoded_logits(model, True, autocast)
    assert all(torch.equal(a, b) for a, b in zip(grown, reserved))


def filled_cache(layer) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = [layer]
    layer.update(torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4))
    return cache


def test_rows_are_repeated_in_place_in_the_autocast_dtype_and_the_room_is_checked():
    cache = filled_cache(DynamicLayer())
    keys = cache.layers[0].keys.clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reserve(cache, 2, capacity=4)
    layer = cache.layers[0]
    assert layer.keys.dtype == layer.values.dtype == torch.bfloat16 and layer.keys.shape == (4, 1, 3, 4)
    assert torch.equal(layer.keys[1], keys[0].bfloat16()) and torch.equal(layer.keys[2], keys[1].bfloat16())
    layer.update(torch.ones(4, 1, 1, 4), torch.ones(4, 1, 1, 4))
    assert layer.get_seq_length() == 4 and bool((layer.values[:, :, 3] == 1).all())
    with pytest.raises(RuntimeError, match="holds 4 positions; 5 asked"):
        layer.update(torch.ones(4, 1, 1, 4), torch.ones(4, 1, 1, 4))


def test_a_cache_with_another_kind_of_layer_is_only_repeated():
    cache = filled_cache(DynamicSlidingWindowLayer(sliding_window=8))
    reserve(cache, 2, capacity=6)
    assert type(cache.layers[0]) is DynamicSlidingWindowLayer and cache.layers[0].keys.shape == (4, 1, 3, 4)
    assert cache.layers[0].keys.dtype == torch.float32
