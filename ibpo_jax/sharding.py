"""Device meshes and the sharding layout of Qwen3 weights and activations ("pjit").

Mesh axes: `data` (pure data parallel, weights replicated), `fsdp` (data parallel with weights
sharded, all-gathered per layer by GSPMD), `tensor` (Megatron-style: heads, MLP hidden and vocab
split). A batch is always split over ("data", "fsdp").

`ShardingSpec` is the one object that says where everything goes; each field name spells the
axes of its array (d hidden, n query heads, k key/value heads, g query heads per key/value
head, h head_dim, f MLP hidden, v vocab, b batch, t positions, s cache slots). `TRAINING` shards
weights over fsdp x tensor; `SAMPLING` keeps weights whole on each fsdp/data replica (no
per-token all-gathers while decoding) and splits them only over tensor.

Activation constraints (`constrain`) apply only while a mesh is set with `jax.set_mesh(mesh)`
around the jitted call (what `Qwen3LM` and the sampler do); outside a mesh they are no-ops, so
the model runs unchanged on one device.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH = ("data", "fsdp")


@dataclasses.dataclass(frozen=True)
class ShardingSpec:
    """PartitionSpecs of every Qwen3 weight (layer-stacked weights get a leading None) and of
    the activations the model constrains."""

    embed_vd: P
    q_dnh: P
    kv_dkh: P
    o_nhd: P
    mlp_in_df: P  # gate_proj and up_proj
    mlp_out_fd: P
    unembed_dv: P
    vector: P  # norm scales, value head: small, replicated
    act_btd: P
    act_bkgth: P
    act_bkth: P
    act_btf: P
    logits_btv: P
    cache_bkhs: P  # decode cache keys (stored transposed)
    cache_bksh: P  # decode cache values


_ACTIVATIONS = dict(
    act_btd=P(BATCH, None, None),
    act_bkgth=P(BATCH, "tensor", None, None, None),
    act_bkth=P(BATCH, "tensor", None, None),
    act_btf=P(BATCH, None, "tensor"),
    logits_btv=P(BATCH, None, "tensor"),
    cache_bkhs=P(BATCH, "tensor", None, None),
    cache_bksh=P(BATCH, "tensor", None, None),
)

TRAINING = ShardingSpec(
    embed_vd=P("tensor", "fsdp"),
    q_dnh=P("fsdp", "tensor", None),
    kv_dkh=P("fsdp", "tensor", None),
    o_nhd=P("tensor", None, "fsdp"),
    mlp_in_df=P("fsdp", "tensor"),
    mlp_out_fd=P("tensor", "fsdp"),
    unembed_dv=P("fsdp", "tensor"),
    vector=P(),
    **_ACTIVATIONS,
)

SAMPLING = ShardingSpec(
    embed_vd=P("tensor", None),
    q_dnh=P(None, "tensor", None),
    kv_dkh=P(None, "tensor", None),
    o_nhd=P("tensor", None, None),
    mlp_in_df=P(None, "tensor"),
    mlp_out_fd=P("tensor", None),
    unembed_dv=P(None, "tensor"),
    vector=P(),
    **_ACTIVATIONS,
)

# Model parameter leaf name -> ShardingSpec field (leaf names are unique in models/qwen3.py).
PARAM_FIELDS = {
    "embedding": "embed_vd",
    "q_proj": "q_dnh",
    "k_proj": "kv_dkh",
    "v_proj": "kv_dkh",
    "o_proj": "o_nhd",
    "gate_proj": "mlp_in_df",
    "up_proj": "mlp_in_df",
    "down_proj": "mlp_out_fd",
    "lm_head": "unembed_dv",
    "q_norm": "vector",
    "k_norm": "vector",
    "input_norm": "vector",
    "post_attn_norm": "vector",
    "final_norm": "vector",
    "value_head": "vector",
    "value_bias": "vector",
}


def make_mesh(*, data: int = 1, fsdp: int = 1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all devices of all processes).

    One size may be -1: it takes what the others leave. The product must equal the device
    count.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"make_mesh: sizes must be positive (one may be -1), got {sizes}")
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if len(devices) % known:
            raise ValueError(f"make_mesh: {len(devices)} devices do not divide by {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(f"make_mesh: data*fsdp*tensor = {math.prod(sizes)} but there are "
                         f"{len(devices)} devices")
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                         devices=devices)


def initialize_distributed(enabled: bool, **kwargs: Any) -> None:
    """Multi-host start-up: `jax.distributed.initialize(**kwargs)` when `enabled` (once).

    Call it first thing in an entry point, before any other jax call. What kwargs leave out
    comes from the cluster (jax's auto-detection: SLURM, Open MPI, Kubernetes, Cloud TPU) or,
    elsewhere, from JAX_COORDINATOR_ADDRESS (host:port), JAX_NUM_PROCESSES and JAX_PROCESS_ID.
    Nothing in the model assumes one process: meshes span `jax.devices()` (all processes),
    checkpoints are read per addressable shard and written by process 0 only.
    """
    if enabled and not jax.distributed.is_initialized():
        for key, env in (("num_processes", "JAX_NUM_PROCESSES"), ("process_id", "JAX_PROCESS_ID")):
            if key not in kwargs and os.environ.get(env):
                kwargs[key] = int(os.environ[env])
        jax.distributed.initialize(**kwargs)


def _axis_size(mesh: Mesh, entry: Any) -> int:
    if entry is None:
        return 1
    names = entry if isinstance(entry, tuple) else (entry,)
    return math.prod(mesh.shape[n] for n in names)


def param_spec(path: tuple[str, ...], ndim: int, layout: ShardingSpec) -> P:
    """PartitionSpec of the parameter at `path` (keys of the params dict) with `ndim` dims."""
    field = PARAM_FIELDS.get(path[-1])
    if field is None:
        raise KeyError(f"no sharding rule for parameter {'/'.join(path)}")
    spec = tuple(getattr(layout, field))
    if len(spec) > ndim:
        raise ValueError(f"parameter {'/'.join(path)} has {ndim} dims, spec {spec} has more")
    # Missing leading entries are the stacked layer axis (scan_layers) or a replicated vector.
    return P(*((None,) * (ndim - len(spec)) + spec))


def param_shardings(params_shape: Any, mesh: Mesh, layout: ShardingSpec = TRAINING) -> Any:
    """NamedSharding for each leaf of a params pytree (arrays or `jax.ShapeDtypeStruct`s).

    Raises ValueError naming the parameter when a sharded dimension does not divide by its
    mesh axes.
    """
    def one(path, leaf):
        keys = tuple(str(getattr(k, "key", k)) for k in path)
        spec = param_spec(keys, len(leaf.shape), layout)
        for dim, entry in zip(leaf.shape, spec):
            if dim % _axis_size(mesh, entry):
                raise ValueError(
                    f"parameter {'/'.join(keys)} of shape {tuple(leaf.shape)}: dimension {dim} "
                    f"does not divide over mesh axes {entry} (size {_axis_size(mesh, entry)}); "
                    f"spec {spec}, mesh {dict(mesh.shape)}")
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(one, params_shape)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of a [B, ...] batch array: B over (data, fsdp), the rest replicated."""
    return NamedSharding(mesh, P(BATCH, *(None,) * (ndim - 1)))


def constrain(x: jax.Array, spec: P) -> jax.Array:
    """`with_sharding_constraint(x, spec)` under the current mesh (`jax.set_mesh`); no-op
    without one. Dimensions that do not divide by their axes stay unconstrained (e.g. a decode
    batch smaller than the data axis) rather than failing."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    entries = []
    for dim, entry in zip(x.shape, tuple(spec) + (None,) * (x.ndim - len(spec))):
        names = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
        size = math.prod(mesh.shape[n] for n in names) if names else 1
        entries.append(entry if dim % size == 0 else P.UNCONSTRAINED)
    return jax.lax.with_sharding_constraint(x, P(*entries))


def host_array(x: jax.Array | np.ndarray) -> np.ndarray:
    """The full value of a possibly multi-process array as numpy (all processes call it)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def process_share(n: int) -> np.ndarray:
    """This process's contiguous share of n items that every process holds on the host (all
    of them on one process): work such as scoring is split by it, then `gather_shares`."""
    p, k = jax.process_count(), jax.process_index()
    return np.arange(n * k // p, n * (k + 1) // p)


def gather_shares(values: np.ndarray, n: int) -> np.ndarray:
    """The [n, ...] whole of the per-process `values` of rows `process_share(n)` (all
    processes call it; the shares are disjoint and cover every row, so a sum assembles them)."""
    values = np.asarray(values)
    if jax.process_count() == 1:
        return values
    wire = np.uint8 if values.dtype == bool else values.dtype  # bool does not sum
    full = np.zeros((n, *values.shape[1:]), wire)
    full[process_share(n)] = values
    return process_sum(full).astype(values.dtype)


def process_sum(x: np.ndarray) -> np.ndarray:
    """Elementwise sum of a host array over processes (all processes call it, same shape):
    counts that each process took over its own rows. Itself on one process."""
    return _over_processes(x).sum(0)


def process_max(x: np.ndarray) -> np.ndarray:
    """Elementwise max of a host array over processes (all processes call it, same shape):
    per-row values that only the processes holding a row know (the others put a floor),
    right also when several processes hold the same row."""
    return _over_processes(x).max(0)


def _over_processes(x: np.ndarray) -> np.ndarray:
    """[processes, ...]: every process's x, stacked (all processes call it)."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x[None]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x))


def local_rows(x: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """(indices, values) of the rows of a [N, ...] array, split over rows only, that this
    process's devices hold: every row on one process, this process's share on many."""
    n = x.shape[0]
    rows: dict[int, np.ndarray] = {}
    for shard in x.addressable_shards:
        if any(sl != slice(None) and sl.indices(dim) != (0, dim, 1)
               for sl, dim in zip(shard.index[1:], x.shape[1:])):
            raise ValueError(f"local_rows: array {x.shape} is split beyond its rows "
                             f"({x.sharding})")
        data = np.asarray(shard.data)
        for j, i in enumerate(range(*shard.index[0].indices(n))):
            rows.setdefault(i, data[j])
    idx = np.array(sorted(rows), np.int64)
    return idx, np.stack([rows[i] for i in idx]) if len(idx) else np.zeros((0, *x.shape[1:]))


def rows_array(values: Any, rows: np.ndarray, n: int, sharding: jax.sharding.Sharding
               ) -> jax.Array:
    """A [N, ...] array placed as `sharding` of which this process knows only rows `rows`
    (their `values`): each process fills its own devices' slices, which must lie within
    `rows` (e.g. rows from `local_rows` of an array with the same sharding)."""
    values = np.asarray(values)
    full = np.zeros((n, *values.shape[1:]), values.dtype)
    full[rows] = values
    known = np.zeros(n, bool)
    known[rows] = True

    def fill(index):
        if not known[index[0]].all():
            raise ValueError("rows_array: a device of this process holds rows it was not given")
        return full[index]

    return jax.make_array_from_callback(full.shape, sharding, fill)


def global_array(x: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """A host value that every process holds identically, placed as `sharding` (each process
    fills only its own devices' slices: works on one host and on many)."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
