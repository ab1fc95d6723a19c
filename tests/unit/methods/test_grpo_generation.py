"""GRPO generation: one prefill, the cache repeated G times, token-by-token decoding; against HF's generate."""

import pytest
import torch

from leantrain.errors import UserError
from leantrain.modeling.generation.backends import backend
from leantrain.modeling.generation.decode import generate, positions, prefill
from leantrain.modeling.generation.sampling import Sampling, draw, filtered
from tests.helpers import WeightCasts
from tests.tiny_models import loss_llama, tiny_gpt2

EOS, PAD = 2, 0
GREEDY = Sampling(max_new_tokens=8, temperature=0)


def models():
    return {"llama": loss_llama(), "gpt2": tiny_gpt2().eval()}  # gpt2's absolute positions: left padding matters


def prompts():
    """Three left-padded prompts of lengths 3, 5 and 6."""
    ids = torch.tensor([[0, 0, 0, 5, 6, 7], [0, 9, 10, 11, 12, 13], [20, 21, 22, 23, 24, 25]])
    mask = (torch.arange(6)[None] >= torch.tensor([[3], [1], [0]])).long()
    return ids, mask


def sampled(model, seed, g=4, **sampling):
    ids, mask = prompts()
    gen = torch.Generator().manual_seed(seed)
    return generate(model, ids, mask, num_generations=g, sampling=Sampling(8, **sampling), eos_ids=[EOS],
                    pad_id=PAD, generator=gen)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_greedy_is_hf_generate_token_for_token(name):
    model = models()[name]
    ids, mask = prompts()
    ours = generate(model, ids, mask, num_generations=2, sampling=GREEDY, eos_ids=[EOS], pad_id=PAD)
    theirs = model.eval().generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8,
                                   pad_token_id=PAD, eos_token_id=EOS)[:, ids.shape[1]:]
    assert torch.equal(ours.completion_ids[0::2], theirs)
    assert torch.equal(ours.completion_ids[1::2], theirs)  # each prompt's G rows are its own


def test_top_k_1_is_greedy():
    model = loss_llama()
    greedy = sampled(model, 0, temperature=0)
    assert torch.equal(sampled(model, 1, top_k=1).completion_ids, greedy.completion_ids)


def test_the_generator_seed_decides_the_samples():
    model = loss_llama()
    first, again, other = sampled(model, 7), sampled(model, 7), sampled(model, 8)
    assert torch.equal(first.completion_ids, again.completion_ids)
    assert not torch.equal(first.completion_ids, other.completion_ids)
    group = first.completion_ids[:4]  # prompt 0's G samples differ from each other
    assert len({tuple(row.tolist()) for row in group}) > 1


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_shared_prefill_is_g_separate_prefills(name):
    model = models()[name].eval()
    ids, mask = prompts()
    with torch.no_grad():
        shared, cache = prefill(model, ids, mask)
        cache.batch_repeat_interleave(3)
        one_by_one = torch.stack([prefill(model, ids[i:i + 1, -int(mask[i].sum()):],
                                          mask[i:i + 1, -int(mask[i].sum()):])[0][0] for i in range(3)])
        repeated, _ = prefill(model, ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0))
    torch.testing.assert_close(shared, one_by_one, atol=1e-5, rtol=1e-5)  # padding changes nothing but rounding
    torch.testing.assert_close(shared.repeat_interleave(3, 0), repeated, atol=1e-6, rtol=1e-6)
    assert cache.get_seq_length() == ids.shape[1] and cache.layers[0].keys.shape[0] == 9


def test_an_eos_ends_its_row_pads_after_and_masks():
    model = loss_llama()
    free = sampled(model, 33, g=2)  # the same draws again below: a row still runs all 8 steps in both
    assert free.truncated.tolist() == [False, True, True, True, True, True]  # row 0 drew the EOS itself
    assert free.completion_mask[0].tolist() == [1] * 5 + [0] * 3 and free.completion_ids[0, 4] == EOS
    row, others = free.completion_ids[2].tolist(), free.completion_ids[[0, 1, 3, 4, 5]].flatten().tolist()
    k = next(k for k in range(1, 8) if row[k] not in row[:k] + others)  # a token only row 2 draws, first at k
    ids, mask = prompts()
    ended = generate(model, ids, mask, num_generations=2, sampling=Sampling(8), eos_ids=[EOS, row[k]], pad_id=PAD,
                     generator=torch.Generator().manual_seed(33))
    assert ended.truncated.tolist() == [False, True, False, True, True, True]
    assert ended.completion_ids[2].tolist() == row[:k + 1] + [PAD] * (7 - k)
    assert ended.completion_mask[2].tolist() == [1] * (k + 1) + [0] * (7 - k)
    assert torch.equal(ended.completion_ids[[0, 1, 3, 4, 5]], free.completion_ids[[0, 1, 3, 4, 5]])
    assert torch.equal(ended.completion_mask[[0, 1, 3, 4, 5]], free.completion_mask[[0, 1, 3, 4, 5]])


def test_decoding_stops_when_every_row_has_ended():
    model = loss_llama()
    ids, mask = prompts()
    first = generate(model, ids, mask, num_generations=1, sampling=GREEDY, eos_ids=[EOS], pad_id=PAD)
    eos_ids = first.completion_ids[:, 1].tolist()  # every row's second token ends it
    ended = generate(model, ids, mask, num_generations=2, sampling=GREEDY, eos_ids=eos_ids, pad_id=PAD)
    assert ended.completion_ids.shape[1] <= 2 and not ended.truncated.any()


def test_lora_adapters_are_active_and_ddp_is_unwrapped(tmp_path):
    from peft import LoraConfig, get_peft_model

    base = loss_llama()
    ids, mask = prompts()
    plain = generate(base, ids, mask, num_generations=1, sampling=GREEDY, eos_ids=[EOS], pad_id=PAD)
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.train()
    ours = generate(lora, ids, mask, num_generations=1, sampling=GREEDY, eos_ids=[EOS], pad_id=PAD)
    assert lora.training  # the mode is restored
    with lora.disable_adapter():
        assert torch.equal(generate(lora, ids, mask, num_generations=1, sampling=GREEDY, eos_ids=[EOS],
                                    pad_id=PAD).completion_ids, plain.completion_ids)
    theirs = lora.eval().generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8,
                                  pad_token_id=PAD, eos_token_id=EOS)[:, ids.shape[1]:]
    assert torch.equal(ours.completion_ids, theirs) and not torch.equal(ours.completion_ids, plain.completion_ids)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        wrapped = torch.nn.parallel.DistributedDataParallel(lora)
        again = generate(wrapped, ids, mask, num_generations=1, sampling=GREEDY, eos_ids=[EOS], pad_id=PAD)
    finally:
        torch.distributed.destroy_process_group()
    assert torch.equal(again.completion_ids, ours.completion_ids)


def test_bf16_autocast_is_the_callers():
    model = loss_llama()
    ids, mask = prompts()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rollout = generate(model, ids, mask, num_generations=2, sampling=Sampling(4), eos_ids=[EOS], pad_id=PAD,
                           generator=torch.Generator().manual_seed(0))
    assert rollout.completion_ids.dtype == torch.long and rollout.completion_ids.shape == (6, 4)


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(8)], ids=["greedy", "sampled"])
def test_lora_frozen_weights_are_cast_once_and_the_tokens_are_the_same(sampling):
    """Through transformers' forward (the step of a model the fused step does not take), under a bf16 autocast."""
    from peft import LoraConfig, get_peft_model

    from leantrain.modeling.fast_paths import DECODE_STEP, decide

    lora = get_peft_model(loss_llama(vocab=64), LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"],
                                                           init_lora_weights=False))
    decide(lora, DECODE_STEP, "transformers")
    ids, mask = prompts()
    frozen = {n for n, p in lora.named_parameters() if not p.requires_grad}
    linears = sum(isinstance(m, torch.nn.Linear) for m in lora.modules())  # LoRA's A and B layers included

    def run(cache: bool):
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache), WeightCasts(of=lora) as casts:
            out = generate(lora, ids, mask, num_generations=3, sampling=sampling, eos_ids=[EOS], pad_id=PAD,
                           generator=torch.Generator().manual_seed(5))
        return out, casts.count

    kept, kept_casts = run(cache=True)
    recast, recast_casts = run(cache=False)  # every weight cast at every call: what the frozen weights had before
    assert torch.equal(kept.completion_ids, recast.completion_ids) and kept.completion_ids.shape[1] > 2
    assert torch.equal(kept.completion_mask, recast.completion_mask)
    assert kept_casts <= linears < recast_casts  # each weight at most once for the whole generation
    assert {n for n, p in lora.named_parameters() if not p.requires_grad} == frozen  # put back


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.05, 0.3, 0.15]])
    kept = lambda p: torch.isfinite(filtered(probs.log(), top_p=p))[0].tolist()  # noqa: E731
    assert kept(0.5) == [True, False, False, False]
    assert kept(0.79) == [True, False, True, False]
    assert kept(0.8) == [True, False, True, False]  # 0.5 + 0.3 reaches 0.8
    assert kept(0.81) == [True, False, True, True]
    assert kept(0.01) == [True, False, False, False]  # at least one token
    renormalised = filtered(probs.log(), top_p=0.8).softmax(-1)
    torch.testing.assert_close(renormalised, torch.tensor([[0.625, 0.0, 0.375, 0.0]]))


def test_a_draw_follows_the_distribution_and_never_takes_a_token_of_probability_0():
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]]).repeat(20000, 1)
    g = torch.Generator().manual_seed(0)
    got = draw(probs, g).view(20000, 2)
    freq = torch.bincount(got[:, 0], minlength=5).double() / 20000
    torch.testing.assert_close(freq, probs[0].double(), atol=0.015, rtol=0)  # 3.5 standard errors of 0.5
    assert (got[:, 1] == 4).all()
    assert torch.equal(draw(probs[:4], torch.Generator().manual_seed(5)),
                       draw(probs[:4], torch.Generator().manual_seed(5)))  # the generator decides
    edge = torch.tensor([[0.25, 0.75, 0.0]], dtype=torch.float32)
    assert int(draw(edge, torch.Generator().manual_seed(1))) in (0, 1)


def test_top_k_then_top_p():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    assert torch.isfinite(filtered(logits, top_k=2))[0].tolist() == [False, True, True, False]
    assert torch.isfinite(filtered(logits, top_k=2, top_p=0.5))[0].tolist() == [False, True, False, False]


def test_positions_start_at_each_rows_first_token():
    assert positions(prompts()[1]).tolist() == [[0, 0, 0, 0, 1, 2], [0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]]


def test_backend_seam():
    from leantrain.modeling.generation import vllm_engine

    assert backend("auto") is generate and backend("transformers") is generate
    chosen = backend("vllm", vllm_engine.VllmSettings(memory=0.1, max_model_len=96))
    assert chosen.func is vllm_engine.generate and chosen.keywords["settings"].max_model_len == 96
    with pytest.raises(UserError, match="grpo.generation='other'"):
        backend("other")
