"""The sampler's two-part KV cache: layouts, one-slot writes, and growth by static widths.

A prompt's keys/values (`PromptKV`) are computed once and shared, read only, by its R sampled
continuations; each continuation row has its own `RowKV`, written one slot per decode step.
Keys are stored transposed ([.., H, S]) so that decode attention reduces over the second-minor
axis (see `attention.decode_attention`).

Per layer or stacked: with `scan_layers` every field is one [L, ...] array (what `nn.scan`
slices or carries), otherwise a cache is a tuple of L per-layer objects; `Qwen3` picks one
layer's view, the functions here take either.

Decode attention costs time in proportion to the row cache's slot count, so the sampler does
not allocate all `max_new_tokens` slots up front: it runs its loop in segments of static widths
(`slot_widths`: 16, 32, 64, ... slots) and pads the cache to the next width between segments
(`grow`, one copy per segment). A step then reads the slots written so far rounded up to the
segment's width, not the whole preallocation.

Axis letters of the shape comments (`qwen3`'s alphabet): L layers, B prompts, R samples per
prompt, K key/value heads, H head_dim, P prompt positions, C row-cache slots, T positions.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class PromptKV(NamedTuple):
    """Keys/values of the prompts, shared by the R rows that continue each one."""

    k: Array  # [B, K, H, P] (transposed)
    v: Array  # [B, K, P, H]


class RowKV(NamedTuple):
    """Each row's own keys/values, one slot per generated token."""

    k: Array  # [B*R, K, H, C] (transposed)
    v: Array  # [B*R, K, C, H]


class KVCache(NamedTuple):
    """prompt: PromptKV; rows: RowKV. Stacked [L, ...] fields (scan_layers) or tuples of L
    per-layer objects."""

    prompt: Any
    rows: Any


def prompt_cache(kv: Any, stacked: bool) -> Any:
    """`Qwen3.encode`'s per-layer (k, v), each [B, K, T, H] (stacked [L, ...] or a tuple of L
    pairs) -> PromptKV with keys transposed, in the same form."""
    if stacked:
        k, v = kv
        return PromptKV(k.swapaxes(-1, -2), v)  # [L, B, K, H, T], [L, B, K, T, H]
    return tuple(PromptKV(k.swapaxes(-1, -2), v) for k, v in kv)


def empty_rows(rows: int, slots: int, num_layers: int, kv_heads: int, head_dim: int,
               dtype: Any, stacked: bool) -> Any:
    """A zero RowKV of `slots` slots for `rows` rows: stacked [L, ...] or a tuple of L."""
    k_shape = (rows, kv_heads, head_dim, slots)  # [B*R, K, H, C]
    v_shape = (rows, kv_heads, slots, head_dim)  # [B*R, K, C, H]
    if stacked:
        return RowKV(jnp.zeros((num_layers, *k_shape), dtype),
                     jnp.zeros((num_layers, *v_shape), dtype))
    return tuple(RowKV(jnp.zeros(k_shape, dtype), jnp.zeros(v_shape, dtype))
                 for _ in range(num_layers))


def slots_of(rows: Any) -> int:
    """The slot count C of a RowKV (stacked or a tuple of L)."""
    return jax.tree.leaves(rows)[-1].shape[-2]  # a value array [.., C, H]


def slot_widths(slots: int, first: int = 16) -> tuple[int, ...]:
    """Static cache widths of the decode segments: first, 2*first, ... capped at `slots`."""
    widths = [min(first, slots)]
    while widths[-1] < slots:
        widths.append(min(2 * widths[-1], slots))
    return tuple(widths)


def grow(rows: Any, slots: int) -> Any:
    """Pads a RowKV (stacked or a tuple of L) with zero slots up to `slots`."""
    def pad(a: Array, axis: int) -> Array:
        widths = [(0, 0)] * a.ndim
        widths[axis] = (0, slots - a.shape[axis])
        return jnp.pad(a, widths)

    if isinstance(rows, RowKV):
        return RowKV(pad(rows.k, -1), pad(rows.v, -2))
    return tuple(grow(r, slots) for r in rows)


def write(rows: RowKV, k_new: Array, v_new: Array, layer: Array | None, index: Array
          ) -> tuple[RowKV, RowKV]:
    """Writes one step's k_new, v_new [B*R, K, 1, H] at slot `index` -> (the updated cache,
    this layer's view of it). `rows` is one layer's (layer None) or stacked [L, ...] (layer:
    the index; writing into the stacked array avoids copying a size-1 layer slice each step
    on XLA:CPU). Written before it is read, so XLA updates the loop-carried cache in place."""
    k, k_layer = _write_slot(rows.k, k_new.swapaxes(2, 3), layer, index, -1)
    v, v_layer = _write_slot(rows.v, v_new, layer, index, -2)
    return RowKV(k, v), RowKV(k_layer, v_layer)


def _write_slot(cache: Array, new: Array, layer: Array | None, index: Array, axis: int
                ) -> tuple[Array, Array]:
    new = new.astype(cache.dtype)
    starts = [0] * cache.ndim
    starts[axis] = index
    if layer is None:
        cache = jax.lax.dynamic_update_slice(cache, new, starts)
        return cache, cache
    starts[0] = layer
    cache = jax.lax.dynamic_update_slice(cache, new[None], starts)
    return cache, jax.lax.dynamic_index_in_dim(cache, layer, 0, keepdims=False)
