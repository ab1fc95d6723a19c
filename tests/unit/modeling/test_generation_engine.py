"""The generation engine (``modeling/generation``) is one greedy decoder for every caller: its tokens equal
transformers' ``model.generate(do_sample=False)`` token for token in fp32, for several prompts of different lengths in
one left-padded batch, on a tiny Llama (the fused decode step) and a tiny GPT-2 (transformers' forward), whether
``max_new_tokens`` or an EOS ends the rows; ``continuations`` (``leantrain generate``, sample prompts) prints the text
of those tokens; ``decode_step`` says which step it took and why."""

from __future__ import annotations

import pytest
import torch

from leantrain.modeling.generation import decode_step as D
from leantrain.modeling.generation import fast_decode
from leantrain.modeling.generation.continuations import continuations, left_padded
from leantrain.modeling.generation.decode import generate, pad_id, prefill, stop_ids
from leantrain.modeling.generation.reserved_cache import reserve
from leantrain.modeling.generation.sampling import Sampling
from tests.helpers import make_tiny_chat_tokenizer

PROMPTS = ["Once upon a time", "It learned to answer questions about the weather and", "Numbers", "The sky is red"]
NEW = 10


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(make_tiny_chat_tokenizer(tmp_path_factory.mktemp("tok")))


def llama(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id)).eval()


def gpt2(tok):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=128,
                                      eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)).eval()


MODELS = {"llama": (llama, D.FUSED), "gpt2": (gpt2, D.TRANSFORMERS)}


def batch(tok):
    ids, mask = left_padded(tok, PROMPTS, False, pad_id(tok), torch.device("cpu"))
    assert len(set(mask.sum(-1).tolist())) == len(PROMPTS)  # every prompt a different length: padding matters
    return ids, mask


def ours(model, tok, eos):
    ids, mask = batch(tok)
    return generate(model, ids, mask, num_generations=1, sampling=Sampling(NEW, temperature=0), eos_ids=eos,
                    pad_id=pad_id(tok))


def theirs(model, tok, eos):
    ids, mask = batch(tok)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW,
                             eos_token_id=eos, pad_token_id=pad_id(tok))
    return out[:, ids.shape[1]:]


def the_step(model, tok):
    """The decode step ``generate`` takes for ``model`` on the prompts' reserved cache."""
    ids, mask = batch(tok)
    with torch.no_grad():
        _, cache = prefill(model, ids, mask)
    return D.decode_step(model, reserve(cache, 1, capacity=ids.shape[1] + NEW))


@pytest.mark.parametrize("name", MODELS)
def test_greedy_is_transformers_generate_when_max_new_tokens_ends_the_rows(tok, name):
    make, step = MODELS[name]
    model = make(tok)
    assert the_step(model, tok).name == step
    mine, hf = ours(model, tok, [tok.eos_token_id]), theirs(model, tok, [tok.eos_token_id])
    assert mine.truncated.all() and mine.completion_ids.shape == (len(PROMPTS), NEW)
    assert torch.equal(mine.completion_ids, hf)
    assert continuations(model, tok, PROMPTS, max_new_tokens=NEW, chat=False) == \
        tok.batch_decode(hf, skip_special_tokens=True)


@pytest.mark.parametrize("name", MODELS)
def test_greedy_is_transformers_generate_when_an_eos_ends_rows(tok, name):
    """The model's generation config names more EOS ids (as chat models do): a token row 0 writes third ends it,
    the others run on or end where they write one; every row's tokens, pads and length equal transformers'."""
    model = MODELS[name][0](tok)
    free = ours(model, tok, [tok.eos_token_id]).completion_ids
    model.generation_config.eos_token_id = [tok.eos_token_id, int(free[0, 2])]
    eos = stop_ids(model, tok)
    assert eos == sorted({tok.eos_token_id, int(free[0, 2])})
    mine, hf = ours(model, tok, eos), theirs(model, tok, eos)
    assert not mine.truncated[0] and mine.completion_mask[0].sum() <= 3
    assert torch.equal(mine.completion_ids, hf)
    assert continuations(model, tok, PROMPTS, max_new_tokens=NEW, chat=False) == \
        tok.batch_decode(hf, skip_special_tokens=True)
    model.generation_config.eos_token_id = sorted({int(t) for t in free[:, 1]} | {tok.eos_token_id})
    ended, hf = ours(model, tok, stop_ids(model, tok)), theirs(model, tok, stop_ids(model, tok))
    assert ended.completion_ids.shape[1] <= 2 and not ended.truncated.any()  # every row ended: decoding stops
    assert torch.equal(ended.completion_ids, hf)


def test_continuations_sample_from_their_own_seeded_generator(tok):
    model = llama(tok)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    first = continuations(model, tok, PROMPTS, max_new_tokens=NEW, chat=False, temperature=1.0, seed=3)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's random state is not moved
    assert first == continuations(model, tok, PROMPTS, max_new_tokens=NEW, chat=False, temperature=1.0, seed=3)
    assert first != continuations(model, tok, PROMPTS, max_new_tokens=NEW, chat=False, temperature=1.0, seed=4)
    assert continuations(model, tok, PROMPTS[:1], max_new_tokens=2, chat=False, temperature=1.0, seed=2**64 - 1)
    assert tok.padding_side == "right" and tok.pad_token is None  # the tokenizer is left as it was


def test_decode_step_says_what_it_chose_and_why(tok, monkeypatch):
    from peft import LoraConfig, get_peft_model

    fused = D.decode_step(llama(tok))  # the model alone: the choice, no step
    assert fused == (None, "fused", "llama is Llama-shaped: the fused decode step")
    assert D.decode_step(gpt2(tok)) == (
        None, "transformers", "gpt2 is not Llama-shaped (llama, mistral, qwen2): transformers' forward")
    step, name, _ = the_step(llama(tok), tok)
    assert name == "fused" and isinstance(step, fast_decode.Decoder)
    ids, mask = batch(tok)
    with torch.no_grad():
        growing = prefill(llama(tok), ids, mask)[1]  # transformers' cache, not reserved
    assert D.decode_step(llama(tok), growing).reason == (
        "its KV cache is not reserved (a cache layer other than transformers' DynamicLayer): transformers' forward")
    lora = get_peft_model(llama(tok), LoraConfig(r=2, target_modules=["q_proj"]))
    assert D.decode_step(lora).name == D.decode_step(lora.get_base_model()).name == "fused"  # adapters folded in
    dora = get_peft_model(llama(tok), LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    assert D.decode_step(dora).reason.startswith("a layer is not a plain linear, LoRA linear or norm (quantized, ")
    monkeypatch.setattr(D, "free_bytes", lambda device: 1000)
    step, name, reason = the_step(llama(tok), tok)
    assert name == "transformers" and not isinstance(step, fast_decode.Decoder)
    assert reason.startswith("its weight copies (") and "do not fit the free memory" in reason


def test_rows_that_ended_leave_the_batch_and_the_others_draw_what_they_would_have(tok, monkeypatch):
    """Sampled rows end at many EOS ids at different times; a reserved cache drops them as they end (the batch
    shrinks), and every row's tokens, mask and log-probs are those of the same generation keeping every row."""
    from leantrain.modeling.generation import decode as engine

    model = llama(tok)
    ids, mask = batch(tok)
    eos = list(range(0, len(tok), 7))  # a seventh of the vocabulary ends a row: rows end at different times

    def sample():
        return generate(model, ids, mask, num_generations=4, sampling=Sampling(NEW, temperature=1.0), eos_ids=eos,
                        pad_id=pad_id(tok), generator=torch.Generator().manual_seed(0))

    kept = []
    monkeypatch.setattr(engine, "keep_rows", lambda cache, rows: (kept.append(len(rows)), reserve_keep(cache, rows)))
    shrunk = sample()
    assert kept and kept == sorted(kept, reverse=True) and kept[-1] < len(PROMPTS) * 4  # the batch shrank
    monkeypatch.setattr(engine, "COMPACT_AT", 2.0)  # never: every row decodes to the end
    kept.clear()
    whole = sample()
    assert not kept
    assert torch.equal(shrunk.completion_ids, whole.completion_ids)
    assert torch.equal(shrunk.completion_mask, whole.completion_mask)
    assert torch.equal(shrunk.truncated, whole.truncated) and not shrunk.truncated.all()
    torch.testing.assert_close(shrunk.logps, whole.logps, atol=1e-5, rtol=1e-5)
    ends = shrunk.completion_mask.sum(-1)
    assert len(set(ends.tolist())) > 2  # the rows ended at several lengths
    last = shrunk.completion_ids.gather(1, (ends - 1)[:, None])[:, 0]
    assert all(t in eos for t in last[~shrunk.truncated].tolist())  # each ended row's last token is an EOS


def reserve_keep(cache, rows):
    from leantrain.modeling.generation.reserved_cache import keep_rows

    keep_rows(cache, rows)


def test_a_stop_string_ends_its_row_where_its_last_token_is_written(tok):
    """The text a row writes is searched (not its ids): a row ends at the token that completes the string, kept
    with it; the rows that never write it run to max_new_tokens; the mask covers what each row wrote."""
    from leantrain.modeling.generation.stops import stop_strings

    model = llama(tok)
    ids, mask = batch(tok)
    free = ours(model, tok, [tok.eos_token_id])
    words = tok.batch_decode(free.completion_ids[:, 3:5].tolist(), skip_special_tokens=True)
    target = words[1].strip()  # row 1's 4th and 5th tokens, as text
    assert target and all(target not in tok.decode(r[:4], skip_special_tokens=True)
                          for r in free.completion_ids.tolist())
    stopped = generate(model, ids, mask, num_generations=1, sampling=Sampling(NEW, temperature=0),
                       eos_ids=[tok.eos_token_id], pad_id=pad_id(tok), stop=stop_strings(tok, [target]))
    texts = [tok.decode(r, skip_special_tokens=True) for r in free.completion_ids.tolist()]
    for row, text in enumerate(texts):
        n = int(stopped.completion_mask[row].sum())
        if target in text:  # ends at the first token whose text completes the string
            first = next(k for k in range(1, NEW + 1)
                         if target in tok.decode(free.completion_ids[row, :k].tolist(), skip_special_tokens=True))
            assert n == first and not stopped.truncated[row]
        else:
            assert n == NEW and stopped.truncated[row]
        assert stopped.completion_ids[row, :n].tolist() == free.completion_ids[row, :n].tolist()
    assert not stopped.truncated[1] and stopped_at_most(stopped, 1, 5)
    assert stop_strings(tok, []) is None and stop_strings(tok, [""]) is None


def stopped_at_most(rollout, row, n) -> bool:
    return int(rollout.completion_mask[row].sum()) <= n
