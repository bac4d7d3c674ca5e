"""The sampler's KV cache: segment widths, growth and one-slot writes (stacked and per layer)."""

import jax
import jax.numpy as jnp
import numpy as np

from ibpo_jax.models import kv_cache


def test_slot_widths_double_from_the_first_and_stop_at_the_slot_count():
    assert kv_cache.slot_widths(63) == (16, 32, 63)
    assert kv_cache.slot_widths(64) == (16, 32, 64)
    assert kv_cache.slot_widths(100, first=8) == (8, 16, 32, 64, 100)
    assert kv_cache.slot_widths(5) == (5,)
    assert kv_cache.slot_widths(1) == (1,)


def _rows(stacked: bool, slots: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    k = jnp.asarray(rng.standard_normal((2, 6, 3, 4, slots)), jnp.float32)  # [L, B*R, K, H, C]
    v = jnp.asarray(rng.standard_normal((2, 6, 3, slots, 4)), jnp.float32)  # [L, B*R, K, C, H]
    if stacked:
        return kv_cache.RowKV(k, v)
    return tuple(kv_cache.RowKV(k[i], v[i]) for i in range(2))


def test_grow_keeps_the_written_slots_and_adds_zero_slots():
    for stacked in (True, False):
        small = _rows(stacked, 5)
        big = kv_cache.grow(small, 9)
        assert kv_cache.slots_of(big) == 9 and kv_cache.slots_of(small) == 5
        s = small if stacked else kv_cache.RowKV(*(jnp.stack(x) for x in zip(*small)))
        g = big if stacked else kv_cache.RowKV(*(jnp.stack(x) for x in zip(*big)))
        np.testing.assert_array_equal(g.k[..., :5], s.k)
        np.testing.assert_array_equal(g.v[..., :5, :], s.v)
        assert not np.asarray(g.k[..., 5:]).any() and not np.asarray(g.v[..., 5:, :]).any()


def test_write_into_the_stacked_cache_equals_writing_the_layer_alone():
    stacked, per_layer = _rows(True, 7), _rows(False, 7)
    rng = np.random.default_rng(1)
    k_new = jnp.asarray(rng.standard_normal((6, 3, 1, 4)), jnp.float32)  # [B*R, K, 1, H]
    v_new = jnp.asarray(rng.standard_normal((6, 3, 1, 4)), jnp.float32)
    full, view = kv_cache.write(stacked, k_new, v_new, jnp.int32(1), jnp.int32(4))
    alone, alone_view = kv_cache.write(per_layer[1], k_new, v_new, None, jnp.int32(4))
    for a, b in zip((view, full._replace(k=full.k[1], v=full.v[1])), (alone_view, alone)):
        np.testing.assert_array_equal(a.k, b.k)
        np.testing.assert_array_equal(a.v, b.v)
    np.testing.assert_array_equal(alone.k[..., 4], k_new[:, :, 0])  # keys stored transposed
    np.testing.assert_array_equal(alone.v[:, :, 4], v_new[:, :, 0])
    np.testing.assert_array_equal(full.k[0], stacked.k[0])  # the other layer untouched
    np.testing.assert_array_equal(np.delete(np.asarray(alone.k), 4, -1),
                                  np.delete(np.asarray(per_layer[1].k), 4, -1))


def test_grow_consumed_equals_grow_and_deletes_its_input():
    for stacked in (True, False):
        small, again = _rows(stacked, 5), _rows(stacked, 5)
        inputs = jax.tree.leaves(small)
        big = kv_cache.grow_consumed(small, 9)
        assert all(x.is_deleted() for x in inputs)  # no second copy of the cache kept
        for a, b in zip(jax.tree.leaves(big), jax.tree.leaves(kv_cache.grow(again, 9))):
            np.testing.assert_array_equal(a, b)


def test_take_rows_gathers_the_row_axis_of_stacked_and_per_layer_caches():
    idx = jnp.asarray([4, 0, 4])
    stacked, per_layer = _rows(True, 3), _rows(False, 3)
    got = kv_cache.take_rows(stacked, idx, True)
    np.testing.assert_array_equal(got.k, np.asarray(stacked.k)[:, [4, 0, 4]])
    for layer, full in zip(kv_cache.take_rows(per_layer, idx, False), per_layer):
        np.testing.assert_array_equal(layer.v, np.asarray(full.v)[[4, 0, 4]])


def test_bucket_sizes_halve_in_multiples_of_the_batch_devices():
    assert kv_cache.bucket_sizes(256) == (256, 128, 64, 32)
    assert kv_cache.bucket_sizes(24, 8) == (24, 16, 8)
    assert kv_cache.bucket_sizes(6, 4) == (6, 4)
    assert kv_cache.bucket_sizes(1) == (1,)


def test_decode_stops_end_legs_at_widths_and_every_few_steps():
    assert kv_cache.decode_stops((16, 32, 39), 0) == [(16, 16), (32, 32), (39, 39)]
    assert kv_cache.decode_stops((16, 64, 100), 20) == [  # legs of 8, 8 and 12 steps
        (8, 16), (16, 16), (24, 64), (32, 64), (40, 64), (48, 64), (56, 64), (64, 64),
        (76, 100), (88, 100), (100, 100)]
    assert kv_cache.decode_stops((4096, 8192), 512)[-3:] == [(7168, 8192), (7680, 8192),
                                                            (8192, 8192)]


def test_row_steps_count_the_rows_each_leg_runs():
    # 8 rows, 40 new tokens (legs to steps 16, 32, 39): one row runs to the end, the others
    # end by step 10: without compaction 8 rows x 39 steps; with it, 8 x 16 + 1 x 23.
    lengths = np.array([40, 3, 5, 11, 2, 9, 4, 7])
    assert kv_cache.row_steps(lengths, 40, compact=False) == (8 * 39, 39)
    assert kv_cache.row_steps(lengths, 40, compact=True) == (8 * 16 + 1 * 23, 39)
    # All done at step 10: the loop stops there either way.
    assert kv_cache.row_steps(lengths.clip(max=11), 40, compact=True) == (8 * 10, 10)
