"""Device meshes and the sharding layout of Qwen3 weights and activations ("pjit").

Mesh axes: `data` (pure data parallel, weights replicated), `fsdp` (data parallel with weights
sharded, all-gathered per layer by GSPMD), `tensor` (Megatron-style: heads, MLP hidden and vocab
split). A batch is always split over ("data", "fsdp").

`ShardingSpec` is the one object that says where everything goes; each field name spells the
axes of its array (d hidden, n query heads, k key/value heads, g query heads per key/value
head, h head_dim, f MLP hidden, v vocab, b batch, t positions, s cache slots). `TRAINING` shards
weights over fsdp x tensor; `SAMPLING` keeps weights whole on each fsdp/data replica (no
per-token all-gathers while decoding) and splits them only over tensor; `SAMPLING_FSDP` keeps
TRAINING's split for weights too big to replicate (see the trade-off at SAMPLING).

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
    lora_a_ir: P = P()  # LoRA adapters (models/lora.py): A [I, r], B [r, O]; replicated unless
    lora_b_ro: P = P()  # split like TRAINING's weights (input / output over fsdp)


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
    lora_a_ir=P("fsdp", None),
    lora_b_ro=P(None, "fsdp"),
    vector=P(),
    **_ACTIVATIONS,
)

# The sampler's weights: a copy in the compute dtype made once per rollout
# (`sampling.compute_weights`), placed by one of two layouts; `SAMPLING_LAYOUTS` names them.
# - SAMPLING ("replicated"): whole on each data/fsdp replica, split only over tensor. A decode
#   step reads its weights locally, no collective; each device holds params / tensor (8B in
#   bf16 on a tensor-free mesh: 16 GB per device).
# - SAMPLING_FSDP ("fsdp"): split over fsdp x tensor like TRAINING; GSPMD all-gathers each
#   layer's weights inside every decode step, so a device holds params / (fsdp x tensor) but
#   every step moves (fsdp - 1) / fsdp of the weights over the interconnect (for 8B bf16 on
#   fsdp = 8: 14 GB per step, ~30 ms at 450 GB/s NVLink against ~5 ms to read 16 GB of HBM).
#   For models whose weights do not fit one device beside the cache; otherwise tensor
#   parallelism (no per-step weight traffic, activations all-reduced instead) is the cheaper
#   way to split them. `param_bytes_per_device` gives a plan the numbers to choose.
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

SAMPLING_FSDP = dataclasses.replace(TRAINING)

SAMPLING_LAYOUTS = {"replicated": SAMPLING, "fsdp": SAMPLING_FSDP}

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


class MeshError(ValueError):
    """The mesh axes do not fit the devices; the message names the config keys and a fix."""


class DistributedSetupError(RuntimeError):
    """jax.distributed did not start for the multi-process launch the run asked for."""


def _keys(names: Sequence[str], sizes: dict[str, int]) -> str:
    return " x ".join(f"config.mesh.{n}={sizes[n]}" for n in names)


def _fix(sizes: dict[str, int]) -> str:
    """The override that makes a mesh fit any device count: the largest explicit axis -1
    (and a -1 axis that was there, 1)."""
    explicit = [n for n in MESH_AXES if sizes[n] != -1]
    grow = max(explicit, key=lambda n: sizes[n])
    fix = f"set config.mesh.{grow}=-1"
    fill = [n for n in MESH_AXES if sizes[n] == -1]
    return fix + (f" and config.mesh.{fill[0]}=1" if fill else "")


def make_mesh(*, data: int = 1, fsdp: int = 1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all devices of all processes).

    At most one size may be -1: it takes the devices the others leave (config.mesh's default
    data=-1 fills any machine). Otherwise the product must equal the device count. A mesh that
    does not fit raises MeshError in config keys, with the override that fixes it.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    bad = [n for n in MESH_AXES if sizes[n] == 0 or sizes[n] < -1]
    if bad:
        raise MeshError(f"{_keys(bad, sizes)}: mesh sizes must be -1 or > 0")
    fill = [n for n in MESH_AXES if sizes[n] == -1]
    if len(fill) > 1:
        raise MeshError(f"{_keys(fill, sizes)}: only one mesh axis may be -1 (it takes the "
                        "devices the others leave); set the others to a size")
    n = len(devices)
    explicit = [a for a in MESH_AXES if sizes[a] != -1]
    known = math.prod(sizes[a] for a in explicit)
    if fill:
        if n % known:
            raise MeshError(f"{_keys(explicit, sizes)} does not divide {n} device(s); "
                            f"{_fix(sizes)}")
        sizes[fill[0]] = n // known
    elif known != n:
        raise MeshError(f"{_keys(explicit, sizes)} = {known} device(s), but there are {n}; "
                        f"{_fix(sizes)}")
    return jax.make_mesh(tuple(sizes[a] for a in MESH_AXES), MESH_AXES,
                         axis_types=(AxisType.Auto,) * 3, devices=devices)


def _count(name: str) -> int:
    """An environment variable as a process count (0 when unset or not a number)."""
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return 0


def _hosts(name: str) -> int:
    return len([h for h in os.environ.get(name, "").split(",") if h.strip()])


def multiprocess_launch() -> str | None:
    """What in the environment says this process is one of several (e.g. "SLURM_NTASKS=4"),
    or None: a plain one-process run. The launchers jax.distributed detects by itself (its
    clusters: SLURM, Open MPI, Cloud TPU) and its own JAX_* variables; nothing here starts
    jax or asks the network, except on a Cloud TPU VM (its metadata server, as jax does)."""
    if os.environ.get("JAX_NUM_PROCESSES"):  # explicit: trusted, whatever else is set
        n = _count("JAX_NUM_PROCESSES")
        return f"JAX_NUM_PROCESSES={n}" if n > 1 else None
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return "JAX_COORDINATOR_ADDRESS=" + os.environ["JAX_COORDINATOR_ADDRESS"]
    # SLURM inside an `srun` step (jax reads these five); the step's tasks, not the job's.
    if all(v in os.environ for v in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS",
                                     "SLURM_PROCID", "SLURM_LOCALID")):
        var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in os.environ else "SLURM_NTASKS"
        if _count(var) > 1:
            return f"{var}={_count(var)}"
    if _count("OMPI_COMM_WORLD_SIZE") > 1:  # mpirun / mpiexec of Open MPI
        return f"OMPI_COMM_WORLD_SIZE={_count('OMPI_COMM_WORLD_SIZE')}"
    for var in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"):  # GKE TPU slices
        if var in os.environ:  # jax reads the first one set
            if _hosts(var) > 1:
                return f"{var} ({_hosts(var)} hosts)"
            break
    if _count("MEGASCALE_NUM_SLICES") > 1:  # TPU multislice
        return f"MEGASCALE_NUM_SLICES={_count('MEGASCALE_NUM_SLICES')}"
    workers = _cloud_tpu_workers()
    return f"Cloud TPU VM metadata ({workers} workers)" if workers > 1 else None


def _cloud_tpu_workers() -> int:
    """Hosts of this Cloud TPU VM's slice per its metadata server (jax's GceTpuCluster reads
    the same), 0 off a TPU VM (no libtpu, no TPU device files) or when it does not answer."""
    import glob
    import importlib.util
    import urllib.request

    if os.environ.get("TPU_SKIP_MDS_QUERY") is not None or importlib.util.find_spec(
            "libtpu") is None or not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")):
        return 0
    host = os.environ.get("GCE_METADATA_IP", "metadata.google.internal")
    request = urllib.request.Request(
        f"http://{host}/computeMetadata/v1/instance/attributes/worker-network-endpoints",
        headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return len([w for w in response.read().decode().split(",") if w.strip()])
    except (OSError, ValueError):
        return 0


def distributed_requested(setting: str | bool) -> bool:
    """Whether config.train.distributed (auto, true or false) starts jax.distributed here:
    auto does when `multiprocess_launch()` finds a multi-process launch."""
    if isinstance(setting, bool):
        return setting
    if setting not in ("auto", "true", "false"):
        raise ValueError(f"distributed setting {setting!r}: expected auto, true or false")
    return setting == "true" or (setting == "auto" and multiprocess_launch() is not None)


def initialize_distributed(setting: str | bool = "auto", **kwargs: Any) -> bool:
    """Multi-host start-up: `jax.distributed.initialize(**kwargs)` when `setting` asks for it
    (`distributed_requested`; once); returns whether this is a multi-process run.

    Call it first thing in an entry point, before any other jax call. What kwargs leave out
    comes from the cluster (jax's auto-detection: SLURM, Open MPI, Kubernetes, Cloud TPU) or,
    elsewhere, from JAX_COORDINATOR_ADDRESS (host:port), JAX_NUM_PROCESSES and JAX_PROCESS_ID.
    A launcher "auto" cannot see (e.g. Kubernetes without those variables) needs
    config.train.distributed=true. Nothing in the model assumes one process: meshes span
    `jax.devices()` (all processes), checkpoints are read per addressable shard and written
    by process 0 only.
    """
    if not jax.distributed.is_initialized() and distributed_requested(setting):
        for key, env in (("num_processes", "JAX_NUM_PROCESSES"), ("process_id", "JAX_PROCESS_ID")):
            if key not in kwargs and os.environ.get(env):
                kwargs[key] = int(os.environ[env])
        try:
            jax.distributed.initialize(**kwargs)
        except (RuntimeError, ValueError) as e:
            why = multiprocess_launch() or "config.train.distributed=true"
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise DistributedSetupError(
                f"jax.distributed.initialize() failed for the multi-process launch ({why}): "
                f"{first}; set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID, "
                "or config.train.distributed=false for one process") from e
    return jax.distributed.is_initialized()


def _axis_size(mesh: Mesh, entry: Any) -> int:
    if entry is None:
        return 1
    names = entry if isinstance(entry, tuple) else (entry,)
    return math.prod(mesh.shape[n] for n in names)


def _field(name: str) -> str | None:
    """The ShardingSpec field of parameter leaf `name` (LoRA adapters by their suffix)."""
    if name.endswith(("_lora_a", "_lora_b")):
        return "lora_a_ir" if name.endswith("_lora_a") else "lora_b_ro"
    return PARAM_FIELDS.get(name)


def param_spec(path: tuple[str, ...], ndim: int, layout: ShardingSpec) -> P:
    """PartitionSpec of the parameter at `path` (keys of the params dict) with `ndim` dims."""
    field = _field(path[-1])
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


def param_bytes_per_device(params_shape: Any, mesh: Mesh, layout: ShardingSpec,
                           dtype: Any = None) -> int:
    """Bytes of a params pytree (arrays or `jax.ShapeDtypeStruct`s) on one device under
    `layout`; with `dtype`, the matrices counted in it where it is narrower (the sampler's
    compute-dtype copy, `sampling.compute_weights`; vectors keep theirs)."""
    narrow = None if dtype is None else np.dtype(dtype)

    def one(path, leaf):
        keys = tuple(str(getattr(k, "key", k)) for k in path)
        spec = param_spec(keys, len(leaf.shape), layout)
        size = np.dtype(leaf.dtype).itemsize
        if narrow is not None and _field(keys[-1]) != "vector":
            size = min(size, narrow.itemsize)
        shards = math.prod(_axis_size(mesh, e) for e in spec)
        return math.prod(leaf.shape) * size // shards

    return sum(jax.tree.leaves(jax.tree_util.tree_map_with_path(one, params_shape)))


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
