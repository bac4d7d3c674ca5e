"""IndexSampler: epoch permutations, determinism, exact resume, disjoint lockstep shards."""

import numpy as np
import pytest

from ibpo_jax.data import sampler
from ibpo_jax.data.sampler import IndexSampler


def test_splitmix64_matches_the_reference_vector():
    # splitmix64 seeded with 0: the first output of the reference generator (Vigna) is
    # 0xE220A8397B1DCDAF, the second 0x6E789E6AA1B965F4.
    assert sampler._splitmix64_int(0) == 0xE220A8397B1DCDAF
    assert sampler._splitmix64_int(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4
    xs = np.array([0, 1, 2**63 + 5, 2**64 - 1], dtype=np.uint64)
    assert [int(v) for v in sampler._splitmix64(xs)] == [
        sampler._splitmix64_int(int(x)) for x in xs]


def test_each_epoch_is_a_permutation_and_epochs_differ():
    s = IndexSampler(50, seed=3)
    first, second = s.next_indices(50), s.next_indices(50)
    assert sorted(first) == list(range(50)) and sorted(second) == list(range(50))
    assert not np.array_equal(first, second)
    assert s.position == 100


def test_same_seed_same_stream_other_seed_other_stream():
    a = IndexSampler(30, seed=1).next_indices(75)
    assert np.array_equal(a, IndexSampler(30, seed=1).next_indices(75))
    assert not np.array_equal(a, IndexSampler(30, seed=2).next_indices(75))


def test_restore_resumes_exactly_across_an_epoch_boundary():
    s = IndexSampler(13, seed=5)
    s.next_indices(7)
    saved = s.position
    expected = s.next_indices(20)  # crosses into epoch 1 and 2
    resumed = IndexSampler(13, seed=5)
    resumed.restore(saved)
    assert np.array_equal(resumed.next_indices(20), expected)
    # Drawing in different chunk sizes gives the same stream.
    chunks = IndexSampler(13, seed=5)
    got = np.concatenate([chunks.next_indices(n) for n in (3, 0, 11, 13)])
    assert np.array_equal(got, IndexSampler(13, seed=5).next_indices(27))


def test_shards_are_disjoint_within_an_epoch_and_in_lockstep():
    n, shards = 23, 4
    samplers = [IndexSampler(n, seed=9, shard_index=i, num_shards=shards) for i in range(shards)]
    per_shard = n // shards
    epoch0 = [s.next_indices(per_shard) for s in samplers]
    union = np.concatenate(epoch0)
    assert len(set(union.tolist())) == shards * per_shard  # no overlap
    assert all(s.position == per_shard for s in samplers)
    # The shards partition the unsharded epoch permutation.
    full = IndexSampler(n, seed=9).epoch_order(0)
    for i, part in enumerate(epoch0):
        assert np.array_equal(part, full[i::shards][:per_shard])


def test_no_shuffle_is_in_order():
    assert IndexSampler(5, seed=0, shuffle=False).next_indices(7).tolist() == [0, 1, 2, 3, 4, 0, 1]


@pytest.mark.parametrize("kwargs, culprit", [
    ({"num_records": 2, "num_shards": 3}, "num_records"),
    ({"num_records": 5, "shard_index": 2, "num_shards": 2}, "shard_index"),
])
def test_bad_arguments(kwargs, culprit):
    with pytest.raises(ValueError, match=culprit):
        IndexSampler(seed=0, **kwargs)
    with pytest.raises(ValueError, match="position"):
        IndexSampler(4, seed=0).restore(-1)
