import numpy as np
import pytest

from leantrain.data.batching import EpochMicroBatches, epoch_batches, split_global_batch


@pytest.mark.parametrize("batching", ["grouped", "dynamic", "padded"])
@pytest.mark.parametrize("n,bs", [(100, 8), (64, 8), (5, 8), (1001, 32)])
def test_every_index_exactly_once_per_epoch(batching, n, bs):
    lengths = np.random.default_rng(0).integers(3, 120, size=n)
    for epoch in range(2):
        batches = epoch_batches(lengths, bs, seed=1, epoch=epoch, batching=batching, group_size=4)
        flat = np.concatenate(batches)
        assert sorted(flat.tolist()) == list(range(n))
        assert all(len(b) == bs for b in batches[:-1])
        assert 1 <= len(batches[-1]) <= bs


def test_epochs_and_seeds_change_the_order_but_not_the_content():
    lengths = np.arange(200)
    a = epoch_batches(lengths, 16, seed=1, epoch=0)
    b = epoch_batches(lengths, 16, seed=1, epoch=1)
    c = epoch_batches(lengths, 16, seed=2, epoch=0)
    again = epoch_batches(lengths, 16, seed=1, epoch=0)
    assert all((x == y).all() for x, y in zip(a, again))
    assert np.concatenate(a).tolist() != np.concatenate(b).tolist()
    assert np.concatenate(a).tolist() != np.concatenate(c).tolist()


def test_grouped_batches_have_similar_lengths_and_longest_first():
    rng = np.random.default_rng(3)
    lengths = rng.integers(2, 128, size=3200)
    grouped = epoch_batches(lengths, 32, seed=0, epoch=0, batching="grouped")
    shuffled = epoch_batches(lengths, 32, seed=0, epoch=0, batching="dynamic")

    def padding(batches):
        return sum(int(lengths[b].max()) * len(b) - int(lengths[b].sum()) for b in batches)

    assert padding(grouped) < 0.2 * padding(shuffled)
    assert lengths[grouped[0]].max() == lengths.max()


def test_drop_last():
    batches = epoch_batches(np.ones(70), 32, seed=0, epoch=0, drop_last=True)
    assert [len(b) for b in batches] == [32, 32]


def test_split_global_batch_pads_empty_parts_with_weight_zero_index():
    parts = split_global_batch(np.array([7, 8, 9]), 4)
    assert [p.tolist() for p in parts] == [[7], [8], [9], [-8]]  # -1 - 7: example 7 with weight 0
    parts = split_global_batch(np.arange(10), 4)
    assert [len(p) for p in parts] == [3, 3, 2, 2]


@pytest.mark.parametrize("world,accum", [(1, 4), (2, 2), (4, 1), (3, 2)])
def test_ranks_and_micro_steps_cover_each_global_batch_once(world, accum):
    lengths = np.random.default_rng(1).integers(1, 50, size=77)
    batches = epoch_batches(lengths, 12, seed=5, epoch=0)
    seen = []
    plans = [EpochMicroBatches(batches, rank=r, world_size=world, accum=accum) for r in range(world)]
    per_rank = [list(p) for p in plans]
    assert len({len(x) for x in per_rank}) == 1  # every rank runs the same number of micro-batches
    for r in range(world):
        for mb in per_rank[r]:
            seen += [i for i in mb if i >= 0]
    assert sorted(seen) == list(range(77))


def test_plan_start_step_skips_whole_steps():
    batches = epoch_batches(np.ones(40), 8, seed=0, epoch=0)
    plan = EpochMicroBatches(batches, rank=0, world_size=1, accum=2, start_step=3)
    assert len(plan) == 4
    assert list(plan)[0] == split_global_batch(batches[3], 2)[0].tolist()
