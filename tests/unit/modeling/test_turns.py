"""Multi-turn generation with the cache kept (``generation.turns.Turns``) is the re-prefilled generation: its first
turn is ``decode.generate``'s, token for token (rows leaving the batch set aside, not lost); a later turn, given the
rows in another order with replies of different lengths appended, continues each row's cache and gives the logits a
re-prefill of the whole sequences gives (fp32, to 1e-4 in the sampler's log-probs) and the same greedy tokens, on a
tiny Llama (the fused decode step), through transformers' forward, and on a tiny GPT-2 (absolute positions: a
continued row's positions count its real tokens), with and without rows leaving the batch."""

from __future__ import annotations

import pytest
import torch

from leantrain.modeling.fast_paths import DECODE_STEP, decide
from leantrain.modeling.generation import decode_step as D
from leantrain.modeling.generation.decode import generate
from leantrain.modeling.generation.sampling import Sampling
from leantrain.modeling.generation.turns import Turns

VOCAB, PAD, G = 64, 0, 3
EOS = list(range(1, 9))  # 8 of 64 tokens end a row: rows end at different steps, the batch compacts


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256)).eval()


def prompts():
    ids = torch.tensor([[PAD, PAD, PAD, 20, 21, 22], [PAD, 30, 31, 32, 33, 34], [40, 41, 42, 43, 44, 45]])
    return ids, (ids != PAD).long()


def first_turn(model, new: int = 12):
    turns = Turns(model, eos_ids=EOS, pad_id=PAD, generator=torch.Generator().manual_seed(1))
    ids, mask = prompts()
    rollout = turns.first(ids, mask, num_generations=G, sampling=Sampling(new, temperature=1.0))
    return turns, rollout


def sequences(rollout, rows):
    """Each row's whole sequence after the first turn: its prompt, its completion, a reply of 1 + row % 4 tokens."""
    ids, mask = prompts()
    out = []
    for r in rows:
        prompt = ids[r // G][mask[r // G].bool()].tolist()
        n = int(rollout.completion_mask[r].sum())
        out.append(prompt + rollout.completion_ids[r, :n].tolist() + [50 + k for k in range(1 + r % 4)])
    return out


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=256)).eval()


@pytest.fixture(params=["fused", "transformers", "gpt2"])
def model(request):
    m = gpt2() if request.param == "gpt2" else llama()
    if request.param == "transformers":
        decide(m, DECODE_STEP, D.TRANSFORMERS)
    return m


def test_the_first_turn_is_generates(model):
    turns, rollout = first_turn(model)
    ids, mask = prompts()
    plain = generate(model, ids, mask, num_generations=G, sampling=Sampling(12, temperature=1.0), eos_ids=EOS,
                     pad_id=PAD, generator=torch.Generator().manual_seed(1))
    assert torch.equal(rollout.completion_ids, plain.completion_ids)
    lengths = rollout.completion_mask.sum(-1)
    assert len(set(lengths.tolist())) > 2 and (lengths < 12).any()  # rows ended at different steps
    assert turns.kept and len(turns.pieces) > 1  # rows left the batch and were set aside


@pytest.mark.parametrize("new", [12, 1])
def test_a_later_turn_equals_the_re_prefill(model, new):
    turns, rollout = first_turn(model, new)
    rows = [7, 0, 4, 8, 2]  # another order, some rows left out
    seqs = sequences(rollout, rows)
    greedy = Sampling(10, temperature=0)
    kept = turns.next(rows, seqs, sampling=greedy)
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[PAD] * (width - len(s)) + s for s in seqs])
    again = generate(model, ids, (torch.arange(width) >= width - torch.tensor([len(s) for s in seqs])[:, None]).long(),
                     num_generations=1, sampling=greedy, eos_ids=EOS, pad_id=PAD)
    assert torch.equal(kept.completion_ids, again.completion_ids)
    assert torch.allclose(kept.logps, again.logps, atol=1e-4)

    # and a third turn on the kept cache of the second
    rows3 = [k for k in range(len(rows)) if kept.truncated[k] or kept.completion_mask[k].sum() > 0][:3]
    seqs3 = [seqs[k] + kept.completion_ids[k, :int(kept.completion_mask[k].sum())].tolist() + [60, 61] for k in rows3]
    third = turns.next(rows3, seqs3, sampling=greedy)
    width = max(len(s) for s in seqs3)
    ids = torch.tensor([[PAD] * (width - len(s)) + s for s in seqs3])
    mask = (torch.arange(width) >= width - torch.tensor([len(s) for s in seqs3])[:, None]).long()
    again3 = generate(model, ids, mask, num_generations=1, sampling=greedy, eos_ids=EOS, pad_id=PAD)
    assert torch.equal(third.completion_ids, again3.completion_ids)
    assert torch.allclose(third.logps, again3.logps, atol=1e-4)


def test_a_sequence_the_cache_already_holds_is_refused(model):
    turns, rollout = first_turn(model)
    ids, mask = prompts()
    with pytest.raises(ValueError, match="nothing the cache lacks"):
        turns.next([0], [ids[0][mask[0].bool()].tolist()], sampling=Sampling(4, temperature=0))
