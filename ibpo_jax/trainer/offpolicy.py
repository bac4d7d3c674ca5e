"""Where and when the RL step's rollouts are sampled (issue 46): on a mesh of their own
(`config.mesh.rollout`), and one step off-policy (`config.rollout.off_policy_steps`).

Rollout mesh. By default the training mesh samples (today's program, unchanged). With
`mesh.rollout.devices` > 0 the sampler runs on a mesh of its own: the last `devices` devices,
which then train nothing (`dedicated`), or the first `devices`, shared with training but in
another (data, fsdp, tensor) split. Once per step the policy is cast to the compute dtype (the
copy decode reads anyway, `sampling.compute_weights`) and resharded from the training layout to
the sampling layout on the rollout mesh (`jax.device_put`; `time_reshard_s`); the sampled
tokens, lengths and log-probs come back to the training mesh for scoring, credit and update.

Off-policy (one step, as verl's one-step-off-policy trainer). Step k's batch was sampled and
scored while step k-1's update ran, with the parameters step k-1 started from, in a background
thread; the update takes the sampler's log-probs as π_old of its ratio (trainer/step.py), and
`policy_lag` is 1 (0 at the first step, sampled synchronously). The update donates the state,
so the sampler reads a copy of its own: the compute-dtype copy (on the rollout mesh, the
resharded one). A collected batch carries its cost in trajectories, charged to the budget
when its step consumes it, so every logged value is what it would be were
the phases run one after the other (`rl_step.learn`). Only one collect runs at a time
(the data position advances in step order); the reward pool is shared with the main thread's
extra rounds and evaluation and serialized by a lock (`Serialized`).

Resume. A checkpoint written while a batch is pending records the data position before that
batch and the arrays of its sampler calls (the random part; scoring is a function of them):
the arrays in an .npz of the checkpoint's step directory (`checkpoint.ARRAYS_FILE`, tens of
MB at the paper's scale), which the JSON record names (the step's only arrays: a record that
names some has a pending batch). The resumed run replays them in the same calls, so its next
step is the uninterrupted run's.

The two schedules are strategies of collecting (`Schedule`: `OnPolicy`, `OffPolicy`), given
the collector and the step's parameters at each call; `Placement` is the sampler's side,
shared by both. Neither sees the trainer.
"""

from __future__ import annotations

import base64
import concurrent.futures
import io
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ibpo_jax.config.sections import RolloutConfig
from ibpo_jax.data.sampler import IndexSampler
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import sampling
from ibpo_jax.trainer import checkpoint

# A record's entry of a pending batch before its arrays became the checkpoint's own item
# (`checkpoint.ARRAYS`, which now alone says a batch is pending): the .npz in base64.
LEGACY_PENDING_KEY = "pending_rollout"

class Sampler(Protocol):
    """The rollout's sampler (`sampling.generate_fn`): G samples of each prompt, and the
    compute-dtype copy of the weights it reads (`shared`, passed back as `cast`)."""

    def __call__(self, params: Any, prompts: Any, prompt_lens: Any, rng: jax.Array, *,
                 cast: Any = None) -> sampling.SampleOutput: ...

    def shared(self, params: Any) -> Any: ...


def meshes(cfg: Any) -> tuple[Mesh, Mesh]:
    """(training mesh, rollout mesh) of `cfg` (config.MeshConfig): the same object when
    mesh.rollout.devices is 0; else the rollout mesh over the last (`dedicated`: the training
    mesh over the others) or the first mesh.rollout.devices devices."""
    r = cfg.rollout
    if r.devices == 0:
        mesh = sharding.make_mesh(data=cfg.data, fsdp=cfg.fsdp, tensor=cfg.tensor)
        return mesh, mesh
    devices = jax.devices()
    n, keep = len(devices), 1 if r.dedicated else 0
    if r.devices > n - keep:
        raise sharding.MeshError(
            f"config.mesh.rollout.devices={r.devices}: there are {n} device(s)"
            + (", and training needs at least one of its own" if keep else ""))
    train = devices[:n - r.devices] if r.dedicated else devices
    sample = devices[n - r.devices:] if r.dedicated else devices[:r.devices]
    mesh = sharding.make_mesh(data=cfg.data, fsdp=cfg.fsdp, tensor=cfg.tensor, devices=train)
    try:
        rollout = sharding.make_mesh(data=r.data, fsdp=r.fsdp, tensor=r.tensor, devices=sample)
    except sharding.MeshError as e:
        raise sharding.MeshError(f"config.mesh.rollout: {e}") from None
    return mesh, rollout


class Serialized:
    """A reward pool scored by one thread at a time (its worker processes hold one job each):
    the background collect, the main thread's extra rounds and evaluation share it."""

    def __init__(self, pool: Any):
        self._pool, self._lock = pool, threading.Lock()

    def score(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._pool.score(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def _each(fn: Callable[[Any], Any], out: sampling.SampleOutput) -> sampling.SampleOutput:
    """`fn` of each array of `out` (fields a sampler leaves None stay None)."""
    return sampling.SampleOutput(*(None if x is None else fn(x) for x in out))


def pack_outputs(outs: list[sampling.SampleOutput]) -> dict[str, np.ndarray]:
    """The sampler calls' host arrays by name ("tokens_0", ...: field, call), for the
    checkpoint's .npz."""
    return {f"{name}_{i}": np.asarray(x) for i, out in enumerate(outs)
            for name, x in out._asdict().items() if x is not None}


def legacy_arrays(text: str) -> dict[str, np.ndarray]:
    """`pack_outputs`' arrays from a checkpoint of before they moved to their own file: the
    .npz bytes in base64, in the JSON record itself."""
    with np.load(io.BytesIO(base64.b64decode(text, validate=True))) as z:
        return {k: z[k] for k in z.files}


def unpack_outputs(data: dict[str, np.ndarray]) -> list[sampling.SampleOutput]:
    """`pack_outputs`' arrays, in call order, on the host."""
    calls = len({k.rsplit("_", 1)[1] for k in data})
    return [sampling.SampleOutput(*(data.get(f"{name}_{i}")
                                    for name in sampling.SampleOutput._fields))
            for i in range(calls)]


class Placement:
    """Where the rollout's sampler runs (module docstring): `generate` samples a step's prompts
    for `collect.Collector.sample`, on the rollout mesh, in rollout.sample_chunk calls, and
    places the samples on the training mesh; a pending batch's calls are recorded, a resumed
    run's replayed (`OffPolicy`).

    `cfg` is the run's rollout section, `meshes` (training mesh, rollout mesh: one object
    unless split, `meshes()`), `dtype` the compute dtype the sampler reads the weights in,
    `sampler` the rollout's."""

    def __init__(self, cfg: RolloutConfig, *, meshes: tuple[Mesh, Mesh], dtype: Any,
                 sampler: Sampler):
        self.cfg, self.dtype, self.sampler = cfg, dtype, sampler
        self.mesh, self.rollout_mesh = meshes
        self.split = self.rollout_mesh is not self.mesh
        self.off_policy = cfg.off_policy_steps > 0
        self.reshard_s = 0.0  # this step's resharding time (reset by the schedule's `take`)
        self._shardings = None  # the sampling layout's, on the rollout mesh (first reshard)
        self._cast: tuple[Any, Any] | None = None  # (params, their copy): one reshard a collect
        self.own: Any = None  # a pending batch's sampler weights, a copy of its own
        self.record: list[sampling.SampleOutput] | None = None  # a pending batch's calls
        self.replay: list[sampling.SampleOutput] = []  # a resumed run's pending calls

    def reshard(self, params: Any) -> Any:
        """The compute-dtype copy of `params` in the sampling layout on the rollout mesh,
        always a copy (the update donates `params`); timed into `reshard_s`. Made once per
        collect: dynamic sampling's rounds sample with the same params."""
        if self._cast is not None and self._cast[0] is params:
            return self._cast[1]
        t0 = time.perf_counter()
        if self._shardings is None:
            self._shardings = sharding.param_shardings(params, self.rollout_mesh,
                                                       sharding.SAMPLING)
        w = jax.device_put(sampling.compute_weights(params, self.dtype), self._shardings,
                           may_alias=False)
        jax.block_until_ready(w)
        self.reshard_s += time.perf_counter() - t0
        self._cast = (params, w)
        return w

    def collect(self, collector: Any, key: jax.Array, params: Any) -> Any:
        """`collector.collect` under `params`; its resharded copy dropped after."""
        try:
            return collector.collect(key, params)
        finally:
            self._cast = None

    def weights_copy(self, params: Any) -> Any:
        """What the sampler reads of `params`, in buffers the update does not donate: the
        resharded copy, or on the training mesh the compute-dtype copy (leaves it would
        pass through unchanged copied)."""
        if self.split:
            return self.reshard(params)
        with jax.set_mesh(self.mesh):
            w = self.sampler.shared(params)
            w = jax.tree.map(lambda a, b: jnp.copy(a) if a is b else a, w, params)
        return jax.block_until_ready(w)

    def generate(self, params: Any, prompts: Any, key: jax.Array) -> sampling.SampleOutput:
        """The sampler's samples of `prompts` (batching.PromptBatch) under `params` on the
        rollout mesh, in rollout.sample_chunk calls, placed on the training mesh. A resumed
        run's pending calls are replayed instead; a pending batch's are recorded."""
        if self.replay:
            out = _each(lambda x: sharding.global_array(
                x, sharding.batch_sharding(self.mesh, x.ndim)), self.replay.pop(0))
        else:
            out = self._sample(params, prompts, key)
        if self.record is not None:
            self.record.append(out)
        return out

    def _sample(self, params: Any, prompts: Any, key: jax.Array) -> sampling.SampleOutput:
        generate, n = self.sampler, len(prompts.lengths)
        # Prompts per sampler call (KV cache memory); with refill one call over a queue.
        chunk = n if self.cfg.refill else (self.cfg.sample_chunk or n)
        mesh = self.rollout_mesh
        if self.split:  # the step's key, where the sampler's programs run
            key = jax.device_put(key, NamedSharding(mesh, P()))
        with jax.set_mesh(mesh):
            # One compute-dtype copy of the weights for every chunk of this rollout (a
            # pending batch's: the copy of its own).
            if params is self.own:
                cast = params
            else:
                cast = (self.reshard(params) if self.split
                        else generate.shared(params) if chunk < n else None)
            outs = [generate(params, prompts.tokens[i:i + chunk], prompts.lengths[i:i + chunk],
                             key if chunk == n else jax.random.fold_in(key, i), cast=cast)
                    for i in range(0, n, chunk)]
            out = outs[0]
            if len(outs) > 1:
                out = sampling.SampleOutput(*(None if parts[0] is None else jax.device_put(
                    jnp.concatenate(parts), sharding.batch_sharding(mesh, parts[0].ndim))
                    for parts in zip(*outs)))
        if self.split or self.off_policy:  # on the training mesh, laid out like a replay's
            out = _each(lambda x: jax.device_put(x, sharding.batch_sharding(self.mesh, x.ndim)),
                        out)
        return out


class Schedule(Protocol):
    """When the collector runs, relative to the update: a strategy of collecting.
    `take` returns the step's batch (collected under the step's `key` with `params`, the
    policy the step starts from; `next_key` is the next step's, None at the last step) and
    the schedule's metrics; `overlaps` says whether sampling runs beside the update (the step
    then logs its own wall time, `time_step_s`). `saved` / `restored` carry a pending batch
    over a checkpoint; `close` waits for one."""

    placement: Placement
    overlaps: bool

    def take(self, collector: Any, key: jax.Array, next_key: jax.Array | None,
             params: Any) -> tuple[Any, dict[str, float]]: ...

    def saved(self, meta: dict[str, Any]
              ) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]: ...

    def restored(self, meta: dict[str, Any], arrays: Callable[[], dict[str, np.ndarray]]
                 ) -> None: ...

    def close(self) -> None: ...


class OnPolicy:
    """Each step collects its own batch, with the parameters it starts from."""

    overlaps = False

    def __init__(self, placement: Placement):
        self.placement = placement

    def take(self, collector: Any, key: jax.Array, next_key: jax.Array | None,
             params: Any) -> tuple[Any, dict[str, float]]:
        self.placement.reshard_s = 0.0
        return self.placement.collect(collector, key, params), {}

    def saved(self, meta: dict[str, Any]) -> tuple[dict[str, Any], None]:
        return meta, None

    def restored(self, meta: dict[str, Any], arrays: Callable[[], dict[str, np.ndarray]]
                 ) -> None:
        """Nothing is ever pending on-policy: arrays a record names mean nothing here."""

    def close(self) -> None:
        pass


class OffPolicy:
    """One step off-policy (module docstring): step s + 1's batch is collected in a background
    thread while step s learns, with a copy of the parameters step s started from. `data` is
    the training split's index sampler (its position before a pending batch is checkpointed)."""

    overlaps = True

    def __init__(self, placement: Placement, data: IndexSampler):
        self.placement, self.data = placement, data
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout")
        self._pending: concurrent.futures.Future | None = None  # Collected
        self._start = 0  # the data position before the pending batch

    def take(self, collector: Any, key: jax.Array, next_key: jax.Array | None,
             params: Any) -> tuple[Any, dict[str, float]]:
        """The batch sampled during the previous update (the first step, or a resumed run
        without a pending one: collected now), after starting the next step's."""
        t0, place = time.perf_counter(), self.placement
        place.reshard_s = 0.0
        lag = 1 if self._pending is not None or place.replay else 0
        if self._pending is None:
            got = place.collect(collector, key, params)
        else:
            got, self._pending = self._pending.result(), None
        wait = time.perf_counter() - t0
        if next_key is not None:  # its cost is charged when its step consumes it
            place.own = own = place.weights_copy(params)
            self._start, place.record = self.data.position, []
            self._pending = self._pool.submit(collector.collect, next_key, own)
        return got, {"policy_lag": float(lag), "time_wait_s": wait}

    def saved(self, meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
        """(the checkpoint record `meta`, the arrays to save beside it): with a pending batch
        (waited for), the data position before it in the record and its sampler calls' arrays
        beside it (`Checkpointer.save` names their file in the record)."""
        if self._pending is None:
            return meta, None
        self._pending.result()
        calls = [_each(sharding.host_array, out) for out in self.placement.record]
        return {**meta, "data_position": self._start}, pack_outputs(calls)

    def restored(self, meta: dict[str, Any], arrays: Callable[[], dict[str, np.ndarray]]
                 ) -> None:
        """After a restore: the pending batch of `meta`, if any, is replayed by the next
        collect (the data sampler is back at its position); `arrays()` reads the
        checkpoint's arrays (`Checkpointer.arrays`)."""
        if meta.get(checkpoint.ARRAYS):
            data = arrays()
            if "tokens_0" in data:  # not partial rollouts' flight (a changed config)
                self.placement.replay = unpack_outputs(data)
        elif meta.get(LEGACY_PENDING_KEY):  # a checkpoint from before the arrays' own file
            self.placement.replay = unpack_outputs(legacy_arrays(meta[LEGACY_PENDING_KEY]))

    def close(self) -> None:
        """Waits for a batch still being sampled (its errors are the step's, not raised)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def schedule(cfg: RolloutConfig, placement: Placement, data: IndexSampler) -> Schedule:
    """The collecting schedule `cfg` (rollout.off_policy_steps) asks for."""
    return OffPolicy(placement, data) if cfg.off_policy_steps else OnPolicy(placement)
