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
(`grow_consumed`: one array at a time, each input freed once its copy is made). A step then
reads the slots written so far rounded up to the segment's width, not the whole preallocation.

Between segments the sampler may also drop finished rows (`take_rows`): the active rows go into
the smallest of a few fixed row counts (`bucket_sizes`), so later segments run fewer rows;
`decode_stops` says where the loop pauses for that and `row_steps` counts what it saves.

Axis letters of the shape comments (`qwen3`'s alphabet): L layers, B prompts, R samples per
prompt, K key/value heads, H head_dim, P prompt positions, C row-cache slots, T positions.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

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


def take_rows(cache: Any, index: Array, stacked: bool) -> Any:
    """Rows `index` [M] of a PromptKV or RowKV (stacked [L, ...] or a tuple of L): every
    array gathered along its row axis."""
    axis = 1 if stacked else 0
    return jax.tree.map(lambda a: jnp.take(a, index, axis=axis), cache)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _pad_slots(a: Array, slots: int, axis: int) -> Array:
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, slots - a.shape[axis])
    return jnp.pad(a, widths)


def grow_consumed(rows: Any, slots: int) -> Any:
    """`grow` that consumes its input: each array (a layer's keys, then its values, ...) is
    padded by its own program and deleted right after, so growing holds the new cache plus one
    old array, not two whole caches. (A jit `donate_argnums` cannot do this: XLA aliases a
    donated buffer only to an output of the same shape, and leaves a bigger one's input
    alive.) The caller must not use `rows` afterwards."""
    def one(a: Array, axis: int) -> Array:
        out = _pad_slots(a, slots, axis % a.ndim)
        a.delete()  # freed once the pad has read it
        return out

    if isinstance(rows, RowKV):
        return RowKV(one(rows.k, -1), one(rows.v, -2))
    return tuple(grow_consumed(r, slots) for r in rows)


def bucket_sizes(rows: int, multiple: int = 1, count: int = 4) -> tuple[int, ...]:
    """Row counts of a compacted decode batch: `rows`, then halves rounded up to `multiple`
    (the batch devices, so rows still split evenly), at most `count` sizes: each is a compiled
    program per segment width, so few sizes bound the recompiles."""
    sizes = [rows]
    while len(sizes) < count:
        half = -(-sizes[-1] // 2)
        half = -(-half // multiple) * multiple
        if half >= sizes[-1]:
            break
        sizes.append(half)
    return tuple(sizes)


def decode_stops(widths: tuple[int, ...], every: int, min_leg: int = 8
                 ) -> list[tuple[int, int]]:
    """(stop, width) of each leg of the decode loop: it runs steps until `stop` with a row
    cache of `width` slots, then returns to the host (finished rows dropped, cache grown).
    Legs end at every width and, with `every` > 0, within a width every
    min(every, max(min_leg, width // 8)) steps: finer where a leg is a large share of the
    responses' lengths, at most `every` (a host read per leg)."""
    stops, start = [], 0
    for width in widths:
        leg = min(every, max(min_leg, width // 8))
        edges = range(start + leg, width, leg) if every > 0 else ()
        stops += [(s, width) for s in edges] + [(width, width)]
        start = width
    return stops


def row_steps(lengths: Any, max_new_tokens: int, *, compact: bool, every: int = 0,
              multiple: int = 1, ended: Any = None) -> tuple[int, int]:
    """(row-steps run, decode steps run) of the sampler's loop for rows of `lengths` [N]
    (generated tokens; `ended` [N] bool: the last is an EOS, default: length <
    max_new_tokens), with or without compacting finished rows: the host-side twin of the
    sampler's schedule, for reporting and planning. A row stays active while it has not
    emitted its EOS (a row without one: to the last step)."""
    lengths = np.asarray(lengths)
    ended = lengths < max_new_tokens if ended is None else np.asarray(ended, bool)
    last = np.where(ended, lengths - 1, max_new_tokens - 1)  # the step at which it is done
    n, end = len(lengths), min(int(last.max(initial=0)), max_new_tokens - 1)
    sizes = bucket_sizes(n, multiple)
    m, step, total = n, 0, 0
    widths = slot_widths(max(max_new_tokens - 1, 1))
    for stop, _ in decode_stops(widths, every if compact else 0):
        if step >= end:
            break
        if compact:
            active = int(np.sum(last > step))
            m = min(m, min(s for s in sizes if s >= active))
        run = min(stop, end) - step
        total, step = total + m * run, step + run
    return total, step


def write(rows: RowKV, k_new: Array, v_new: Array, layer: Array | None, index: Array
          ) -> tuple[RowKV, RowKV]:
    """Writes one step's k_new, v_new [B*R, K, 1, H] at slot `index` (a scalar; or [B*R], each
    row its own slot, as slot refill's rows are at different steps) -> (the updated cache,
    this layer's view of it). `rows` is one layer's (layer None) or stacked [L, ...] (layer:
    the index; writing into the stacked array avoids copying a size-1 layer slice each step
    on XLA:CPU). Written before it is read, so XLA updates the loop-carried cache in place."""
    if jnp.ndim(index):
        return _write_rows(rows, k_new, v_new, layer, index)
    k, k_layer = _write_slot(rows.k, k_new.swapaxes(2, 3), layer, index, -1)
    v, v_layer = _write_slot(rows.v, v_new, layer, index, -2)
    return RowKV(k, v), RowKV(k_layer, v_layer)


def _write_rows(rows: RowKV, k_new: Array, v_new: Array, layer: Array | None, index: Array
                ) -> tuple[RowKV, RowKV]:
    """`write` with a slot per row: row i's key/value at slot index[i] (one past the cache:
    dropped)."""
    ar = jnp.arange(index.shape[0])
    lead = () if layer is None else (layer,)
    k = rows.k.at[(*lead, ar, slice(None), slice(None), index)].set(
        k_new[:, :, 0].astype(rows.k.dtype), mode="drop")  # [.., B*R, K, H, C]
    v = rows.v.at[(*lead, ar, slice(None), index)].set(
        v_new[:, :, 0].astype(rows.v.dtype), mode="drop")  # [.., B*R, K, C, H]
    if layer is None:
        return RowKV(k, v), RowKV(k, v)
    view = lambda a: jax.lax.dynamic_index_in_dim(a, layer, 0, keepdims=False)  # noqa: E731
    return RowKV(k, v), RowKV(view(k), view(v))


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
