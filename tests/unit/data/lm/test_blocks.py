"""Blocks over token shards (data/lm/blocks.py), the global batching over them, and the LM collator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from leantrain.data.batching import EpochMicroBatches, WeightedView, epoch_batches
from leantrain.data.lm.blocks import Blocks
from leantrain.data.lm.collate import LMCollator
from leantrain.data.loaders import epoch_micro_batches
from leantrain.data.lm.shard_writer import write_shards
from leantrain.data.lm.token_shards import TokenShards
from leantrain.data.lm.token_sources import open_token_source
from leantrain.engine.checkpoint.save import data_fingerprint
from tests.helpers import lm_documents, make_tiny_lm_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(make_tiny_lm_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tok):
    folder = tmp_path_factory.mktemp("corpus")
    docs = lm_documents(60, seed=2)
    (folder / "c.txt").write_text("\n".join(docs))
    write_shards(open_token_source(str(folder / "c.txt"), "data.train", separator="\n"), tok, folder / "shards")
    return docs, TokenShards.open(folder / "shards")


def test_blocks_cut_the_stream_and_drop_the_tail(corpus):
    _, shards = corpus
    blocks = Blocks(shards, 32)
    assert len(blocks) == shards.n_tokens // 32 and blocks.tail_tokens == shards.n_tokens % 32 > 0
    rows = blocks[list(range(len(blocks)))]
    flat = [t for ids in rows["input_ids"] for t in ids]
    assert flat == shards.read(0, len(blocks) * 32).tolist()  # packed across documents, in order
    assert rows["labels"] == rows["input_ids"]  # not shifted: the model shifts
    assert set(rows["length"]) == {32} and set(rows["targets"]) == {31}
    assert np.array_equal(blocks["targets"], rows["targets"]) and blocks["length"].tolist() == rows["length"]
    assert blocks.column_names == ["input_ids", "labels", "length", "targets"]


def test_document_mask_rows(corpus, tok):
    docs, shards = corpus
    blocks = Blocks(shards, 32, document_mask=True)
    starts = set(shards.document_starts().tolist())
    for b in range(len(blocks)):
        row = blocks[b]
        s = b * 32
        for i in range(32):
            new_doc = (s + i) in starts
            assert (row["labels"][i] == -100) == (new_doc and i > 0)
            assert (row["position_ids"][i] == 0) == (new_doc or i == 0)
            if i and not new_doc:
                assert row["position_ids"][i] == row["position_ids"][i - 1] + 1
        assert row["targets"] == sum(1 for i in range(1, 32) if row["labels"][i] != -100)
    assert blocks["targets"].sum() < Blocks(shards, 32)["targets"].sum()


@pytest.mark.parametrize("batching", ["grouped", "dynamic"])
def test_every_block_once_per_epoch_over_1_2_4_ranks(corpus, batching):
    _, shards = corpus
    blocks = Blocks(shards, 16)
    n = len(blocks)
    assert n > 40
    for epoch in (0, 1):
        seen = {}
        for world in (1, 2, 4):
            got = []
            for rank in range(world):
                micro = epoch_micro_batches(blocks, batch_size=8, seed=3, epoch=epoch, batching=batching, group_size=50,
                                            drop_last=False, rank=rank, world_size=world, accum=8 // world)
                for ids in micro:
                    rows = WeightedView(blocks, blocks.column_names).__getitems__(ids)
                    got += [i for i, r in zip(ids, rows) if r["loss_weight"] == 1.0]
            assert sorted(got) == list(range(n))  # every block exactly once over the ranks
            seen[world] = sorted(got)
        assert seen[1] == seen[2] == seen[4]
    one = epoch_batches(blocks["length"], 8, seed=3, epoch=0)
    assert [b.tolist() for b in one] == [b.tolist() for b in epoch_batches(blocks["length"], 8, seed=3, epoch=0)]


def test_hold_out_select_and_fingerprint(corpus):
    _, shards = corpus
    blocks = Blocks(shards, 16)
    train, evaluation = blocks.hold_out(0.1, seed=5)
    assert len(evaluation) == round(0.1 * len(blocks)) and len(train) + len(evaluation) == len(blocks)
    assert not set(train.indices) & set(evaluation.indices)
    again, _ = blocks.hold_out(0.1, seed=5)
    assert data_fingerprint(again) == data_fingerprint(train) != data_fingerprint(evaluation)
    assert data_fingerprint(Blocks(shards, 16, document_mask=True)) != data_fingerprint(blocks)
    assert train.select([0, 1])["input_ids"] == train[[0, 1]]["input_ids"]
    view = train.select_columns(["input_ids", "length"]).with_format(None)
    assert view.column_names == ["input_ids", "length"] and set(view[[0]]) == {"input_ids", "length"}


def test_blocks_travel_to_spawned_workers_without_their_tokens(corpus):
    import pickle

    _, shards = corpus
    blocks = Blocks(shards, 16, document_mask=True).select([3, 1])
    data = pickle.dumps(blocks)
    assert shards.read(0, 32).astype("<u2").tobytes() not in data  # the memory maps are reopened, not copied
    again = pickle.loads(data)
    assert again[[0, 1]] == blocks[[0, 1]] and again.data_fingerprint() == blocks.data_fingerprint()


def test_collator_pads_and_masks():
    collate = LMCollator(7)
    rows = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3], "loss_weight": 1.0},
            {"input_ids": [4, 5], "labels": [-100, 5], "loss_weight": 0.0}]
    out = collate(rows)
    assert out["input_ids"].tolist() == [[1, 2, 3], [4, 5, 7]]
    assert out["labels"].tolist() == [[1, 2, 3], [-100, 5, -100]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert out["loss_weight"].tolist() == [1.0, 0.0] and "position_ids" not in out
    same = collate([rows[0], rows[0]])
    assert "attention_mask" not in same  # nothing padded: no mask
    packed = [{"input_ids": [1, 2, 3, 4], "labels": [1, 2, -100, 4], "position_ids": [0, 1, 0, 1]},
              {"input_ids": [5, 6], "labels": [5, 6], "position_ids": [0, 1]}]
    out = collate(packed)
    assert out["position_ids"].tolist() == [[0, 1, 0, 1], [0, 1, 2, 3]]  # padding continues the positions
    assert "attention_mask" not in out  # restarts: the mask comes from position_ids
    assert out["labels"].tolist()[1] == [5, 6, -100, -100] and out["input_ids"].dtype == torch.long
    plain = collate([{"input_ids": [1, 2, 3], "position_ids": [0, 1, 2]}, {"input_ids": [4]}])
    assert plain["position_ids"].tolist() == [[0, 1, 2], [0, 1, 2]] and "attention_mask" in plain
    assert plain["labels"].tolist() == [[1, 2, 3], [4, -100, -100]]


def test_collated_blocks_reach_the_micro_batches(corpus):
    _, shards = corpus
    blocks = Blocks(shards, 16, document_mask=True)
    micro = EpochMicroBatches(epoch_batches(blocks["length"], 4, seed=0, epoch=0), rank=0, world_size=1, accum=1)
    ids = next(iter(micro))
    batch = LMCollator(1)(WeightedView(blocks, blocks.column_names).__getitems__(ids))
    assert batch["input_ids"].shape == (4, 16) and "attention_mask" not in batch
    assert int((batch["labels"][:, 1:] != -100).sum()) == int(blocks["targets"][ids].sum())


def test_document_mask_losses_equal_documents_alone(tmp_path, tok, corpus):
    """A packed block under data.document_mask: each document's per-token losses equal those of the document run
    alone (tiny Llama, fp32). transformers builds the block-diagonal mask from the restarting position_ids when
    attention_mask is None and no KV cache is made (use_cache=False)."""
    from transformers import AutoModelForCausalLM

    from tests.helpers import make_tiny_llama

    _, shards = corpus
    model = AutoModelForCausalLM.from_pretrained(make_tiny_llama(tmp_path / "llama", tok.name_or_path),
                                                 dtype=torch.float32).eval()
    blocks = Blocks(shards, 64, document_mask=True)
    rows = [blocks[b] for b in range(3)]
    batch = LMCollator(tok.eos_token_id)(rows)
    assert "attention_mask" not in batch

    def token_losses(ids, positions=None, use_cache=False):
        with torch.no_grad():
            logits = model(input_ids=ids, position_ids=positions, use_cache=use_cache).logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")

    packed = token_losses(batch["input_ids"], batch["position_ids"])
    unmasked = token_losses(batch["input_ids"])
    # transformers 5.24: a forward pass that makes a KV cache (use_cache=True, the config's default) skips the packed
    # mask: positions restart but attention crosses documents. Training and evaluation must run with use_cache=False.
    cached = token_losses(batch["input_ids"], batch["position_ids"], use_cache=True)
    assert not torch.allclose(cached, packed, atol=1e-3)
    checked = 0
    for r, row in enumerate(rows):
        cuts = [i for i, p in enumerate(row["position_ids"]) if p == 0] + [64]
        for a, b in zip(cuts, cuts[1:]):  # one document (or the part of one inside the block)
            alone = token_losses(batch["input_ids"][r: r + 1, a:b])[0]
            targets = [i for i in range(a + 1, b) if row["labels"][i] != -100]
            assert targets == list(range(a + 1, b))
            torch.testing.assert_close(packed[r, a: b - 1], alone, rtol=1e-5, atol=1e-5)
            if a > 0:
                assert not torch.allclose(unmasked[r, a: b - 1], alone, atol=1e-3)  # attention crossed documents
            checked += 1
    assert checked >= 6


def test_the_data_line_of_a_language_model_counts_sequences_and_tokens_not_labels():
    import datasets

    from leantrain.data.modalities import for_modality

    train, evals = datasets.Dataset.from_dict({"length": [32, 32, 20]}), datasets.Dataset.from_dict({"length": [32]})
    assert for_modality("tokens").describe(train, evals, []) == "3 train / 1 eval sequences, 84 / 32 tokens"
    assert for_modality("text").describe(train, evals, ["neg", "pos"]) == "3 train / 1 eval rows, 2 labels ['neg', 'pos']"
    assert for_modality("text").describe(train, evals, ["score"]) == "3 train / 1 eval rows, 1 label ['score']"
