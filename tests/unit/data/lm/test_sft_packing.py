"""SFT packing: several examples per block, positions restarting per example, and per-example losses in a packed
block equal to the examples run alone (tiny Llama, fp32)."""

from __future__ import annotations

import datasets
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from leantrain.data.lm import instructions as ins
from tests.helpers import CHATML, make_tiny_llama, make_tiny_chat_tokenizer

QA = [("What is 2 + 2?", "The answer is 4."), ("Hello", "Hello world."), ("Give three tips for staying healthy.",
      "Eat well, sleep, and move every day!"), ("Once upon a time", "there was a small model."), ("What?", "Numbers.")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft-pack")
    tok_dir = make_tiny_chat_tokenizer(root / "tok", chat_template=CHATML)
    model = AutoModelForCausalLM.from_pretrained(make_tiny_llama(root / "model", tok_dir), dtype=torch.float32)
    return AutoTokenizer.from_pretrained(tok_dir), model.eval()


def processed(tok, train_on_prompt=False):
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in QA]
    return ins.process(datasets.Dataset.from_list(rows), tok, block_size=64, train_on_prompt=train_on_prompt).dataset


def test_pack_order_fits_every_example_once():
    lengths = [50, 10, 30, 20, 40, 64, 5]
    groups = ins.pack_order(lengths, 64)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in g) <= 64 for g in groups)
    assert len(groups) == 4 and groups == ins.pack_order(lengths, 64)


def test_packed_rows_follow_the_contract(tiny):
    tok, _ = tiny
    rows = processed(tok)
    packed = ins.pack(rows, 64)
    assert packed.examples == len(rows) and packed.blocks < len(rows)
    assert packed.padding_after < packed.padding_before
    assert "padding saved" in packed.note(64)
    total = 0
    for r in packed.dataset:
        assert r["length"] == len(r["input_ids"]) == len(r["labels"]) == len(r["position_ids"]) <= 64
        starts = [i for i, p in enumerate(r["position_ids"]) if p == 0]
        assert starts[0] == 0 and len(starts) >= 1
        assert all(r["labels"][s] == -100 for s in starts)  # nothing is predicted across an example boundary
        assert r["targets"] == sum(y != -100 for y in r["labels"][1:])
        total += r["targets"]
    assert total == sum(rows["targets"])


def per_token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits[:-1].float(), labels[1:], ignore_index=-100, reduction="none")


@pytest.mark.parametrize("train_on_prompt", [False, True])
def test_per_example_losses_in_a_packed_block_equal_the_examples_alone(tiny, train_on_prompt):
    tok, model = tiny
    rows = processed(tok, train_on_prompt)
    packed = ins.pack(rows, 64).dataset
    alone = {}
    with torch.no_grad():
        for r in rows:
            out = model(input_ids=torch.tensor([r["input_ids"]]), use_cache=False).logits[0]
            alone[tuple(r["input_ids"])] = per_token_losses(out, torch.tensor(r["labels"]))
        # two packed rows in one batch, the shorter padded (positions continuing, labels -100), no attention mask
        width = max(packed["length"])
        ids = torch.full((len(packed), width), tok.eos_token_id)
        pos = torch.stack([torch.arange(width)] * len(packed))
        labels = torch.full((len(packed), width), -100)
        for i, r in enumerate(packed):
            n = r["length"]
            ids[i, :n], labels[i, :n] = torch.tensor(r["input_ids"]), torch.tensor(r["labels"])
            pos[i, :n] = torch.tensor(r["position_ids"])
            pos[i, n:] = torch.arange(r["position_ids"][-1] + 1, r["position_ids"][-1] + 1 + width - n)
        # use_cache=False: with a cache transformers ignores the packed-sequence mask built from position_ids
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    seen = 0
    for i, r in enumerate(packed):
        losses = per_token_losses(logits[i], labels[i])
        starts = [j for j, p in enumerate(r["position_ids"]) if p == 0] + [r["length"]]
        for a, b in zip(starts, starts[1:]):
            solo = alone[tuple(r["input_ids"][a:b])]
            # the example's targets are labels a+1..b-1, predicted from positions a..b-2
            torch.testing.assert_close(losses[a : b - 1], solo, rtol=1e-5, atol=1e-6)
            seen += 1
        assert losses[starts[-1] - 1 :].sum() == 0  # padding and the boundary carry no loss
    assert seen == len(rows)


def test_the_step_keeps_packed_examples_apart(tiny):
    """Through the engine's forward (model_inputs) and the causal-LM loss, with the model's own config (use_cache on,
    as loaded): the loss of a batch of packed blocks is the sum of the examples' losses run alone."""
    from leantrain.data.lm.collate import LMCollator
    from leantrain.methods import get_task

    tok, model = tiny
    assert model.config.use_cache
    rows = processed(tok)
    packed = ins.pack(rows, 64).dataset
    batch = LMCollator(tok.eos_token_id)([dict(r) for r in packed])
    assert "attention_mask" not in batch
    with torch.no_grad():
        got, _ = get_task("causal-lm").step.forward_loss(model, batch)
        alone = sum(per_token_losses(model(input_ids=torch.tensor([r["input_ids"]])).logits[0],
                                     torch.tensor(r["labels"])).sum() for r in rows)
    torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)
