"""The sampler's KV cache: segment widths, growth and one-slot writes (stacked and per layer)."""

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
