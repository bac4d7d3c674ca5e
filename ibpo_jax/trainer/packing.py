"""Sequence packing for the update: several rollout rows share one row of the model's input,
so the forward and backward passes skip most of the padding.

A rollout row i holds prompt_len_i + response_len_i real tokens in a [P + R] row (prompt
left-padded, response right-padded); in a math RL batch most of the row is padding (responses
end long before `max_new_tokens`). A `Packing` puts row i in packed row `bin[i]`, starting at
column `start[i]`; a packed row holds whole rollout rows, P + R tokens at most, and each row is
its own segment: attention stays within it and positions restart at 0
(`models.token_logprobs(segment_ids=...)`), so every log-prob equals the unpacked one.

The number of packed rows is data-dependent; it is rounded up to a few sizes (multiples of
`N / 16`, see `first_fit`) so that a run compiles the update a few times at most. `identity` is
the rollout's own layout (one row per packed row, `start` = P - prompt_len): the same code path,
used when the update needs whole groups together (cancellation transforms).

The update partitions packed rows into minibatches and micro-batches in `unit`s: whole groups
(G rows) for the identity plan, single packed rows when packed.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ibpo_jax.runtime import sharding

Array = jax.Array

BUCKETS = 16  # packed-row counts are multiples of ~N / BUCKETS: at most 16 compiled sizes


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Packing:
    """Where each rollout row goes: packed row `bin` [N] int32, first column `start` [N]."""

    bin: Array
    start: Array
    rows: int = dataclasses.field(metadata=dict(static=True))  # packed rows M
    unit: int = dataclasses.field(metadata=dict(static=True))  # packed rows per partition unit


def identity(prompt_len: np.ndarray, prompt_width: int, group_size: int) -> Packing:
    """The rollout's own layout: row i alone in packed row i, its prompt ending at column P-1."""
    n = len(prompt_len)
    return Packing(np.arange(n, dtype=np.int32),
                (prompt_width - np.asarray(prompt_len)).astype(np.int32), n, group_size)


def first_fit(prompt_len: np.ndarray, response_len: np.ndarray, width: int, *,
              multiple: int) -> Packing:
    """First-fit decreasing: rows by descending length, each into the first packed row with
    room. The row count is rounded up to a multiple of `multiple` (what the minibatch /
    micro-batch split and the mesh need) times ceil(N / (multiple * BUCKETS)), and capped at
    N (N must divide by `multiple`). Deterministic (stable order)."""
    lengths = np.asarray(prompt_len, np.int64) + np.asarray(response_len, np.int64)
    n = len(lengths)
    if n % multiple:
        raise ValueError(f"{n} rows do not split into multiples of {multiple}")
    if lengths.max(initial=0) > width:
        raise ValueError(f"a row of {lengths.max()} tokens does not fit the width {width}")
    free = np.full(n, width, np.int64)  # room left in each packed row (at most n rows)
    used = 0
    bins = np.empty(n, np.int32)
    starts = np.empty(n, np.int32)
    for i in np.argsort(-lengths, kind="stable"):
        b = int(np.argmax(free[:used + 1] >= lengths[i]))  # row `used` is empty: always fits
        bins[i], starts[i] = b, width - free[b]
        free[b] -= lengths[i]
        used = max(used, b + 1)
    step = multiple * math.ceil(n / (multiple * BUCKETS))
    return Packing(bins, starts, min(-(-used // step) * step, n), 1)


def place(plan: Packing, put) -> Packing:
    """The plan with its arrays put on device by `put(np.ndarray) -> Array`."""
    return dataclasses.replace(plan, bin=put(np.asarray(plan.bin, np.int32)),
                               start=put(np.asarray(plan.start, np.int32)))


def pack(plan: Packing, prompt: Array, prompt_len: Array, response: Array, response_len: Array
         ) -> tuple[Array, Array, Array]:
    """The rollout's real tokens in packed rows.

    prompt [N, P] (left-padded), response [N, R] -> tokens [M, P + R] int32, segments
    [M, P + R] int32 (row i's tokens carry i + 1, padding 0), and `first` [N] int32: the
    packed column of row i's first response token (its predictions are `first + j`).
    """
    n, p = prompt.shape
    w = p + response.shape[1]
    tokens = jnp.concatenate([prompt, response], axis=1)  # [N, W], real: [P - pl, P + rl)
    col = jnp.arange(w)[None, :]
    real = (col >= (p - prompt_len)[:, None]) & (col < (p + response_len)[:, None])
    shift = plan.start - (p - prompt_len)  # packed column - rollout column, per row
    flat = plan.bin[:, None] * w + col + shift[:, None]  # [N, W]
    flat = jnp.where(real, flat, plan.rows * w)  # out of range: dropped
    ids = jnp.broadcast_to(jnp.arange(1, n + 1, dtype=jnp.int32)[:, None], (n, w))
    packed = jnp.zeros((plan.rows * w,), jnp.int32)
    packed_tokens = packed.at[flat].set(tokens, mode="drop").reshape(plan.rows, w)
    segments = packed.at[flat].set(ids, mode="drop").reshape(plan.rows, w)
    return packed_tokens, segments, (p + shift).astype(jnp.int32)


def local_rows(rows: Array, bin: Array, total: int) -> Array:
    """rows [C] (packed-row ids of a chunk) -> each rollout row's index in the chunk, -1 where
    the row is in another chunk ([N] int32)."""
    where = jnp.full((total,), -1, jnp.int32).at[rows].set(jnp.arange(rows.shape[0],
                                                                       dtype=jnp.int32))
    return where[bin]


def unpack(x: Array, local: Array, first: Array, width: int) -> Array:
    """Per-token values of packed rows x [C, W] -> [N, width]: entry [i, j] is x at row
    local[i], column first[i] + j (0 for rows not in the chunk, local = -1). Entries past a
    row's own length hold whatever follows it (callers mask them)."""
    c, w = x.shape
    idx = local[:, None] * w + first[:, None] + jnp.arange(width)[None, :]
    out = jnp.take(x.reshape(-1), jnp.clip(idx, 0, c * w - 1))
    return jnp.where((local >= 0)[:, None], out, 0)


@dataclasses.dataclass(frozen=True)
class Packer:
    """A run's packing rule: first-fit into packed rows whose count is a multiple of
    `multiple` (`packed`: optim.layout "packed"), else whole groups of `group_size` rows; plans
    placed on `mesh`, replicated."""

    mesh: Mesh
    group_size: int
    packed: bool
    multiple: int = 1

    def plan(self, prompt_len: np.ndarray, response_len: np.ndarray, prompt_width: int,
             response_width: int, *, whole_groups: bool = False) -> Packing:
        """Where the update's model passes put each rollout row (every row's lengths [N],
        the same on every process); `whole_groups`: the identity plan whatever the layout."""
        if self.packed and not whole_groups:
            plan = first_fit(prompt_len, response_len, prompt_width + response_width,
                             multiple=self.multiple)
        else:
            plan = identity(prompt_len, prompt_width, self.group_size)
        return place(plan, lambda x: sharding.global_array(x, NamedSharding(self.mesh, P())))
