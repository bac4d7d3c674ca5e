"""Train state and optimizer (optax AdamW with warm-up, schedule and global-norm clipping)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ibpo_jax.config import OptimConfig, RunConfig
from ibpo_jax.models import lora
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler.sampling import compute_weights


class TrainState(NamedTuple):
    """Everything an update changes; a pytree that orbax saves and restores."""

    params: Any
    opt_state: Any
    step: jax.Array  # int32 scalar: completed RL steps


def learning_rate(optim: OptimConfig, total_steps: int) -> optax.Schedule:
    """Linear warm-up over `optim.warmup_steps` updates (the first update already takes
    lr / warmup_steps, none is wasted at 0), then constant or cosine decay to 0 at
    `total_steps`."""
    warmup = max(optim.warmup_steps, 1)

    def schedule(count):
        lr = optim.lr * jnp.minimum(1.0, (count + 1) / warmup)
        if optim.schedule == "cosine":
            span = max(total_steps - optim.warmup_steps, 1)
            progress = jnp.clip((count - optim.warmup_steps) / span, 0.0, 1.0)
            lr = lr * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return lr

    return schedule


def make_optimizer(optim: OptimConfig, *, total_updates: int) -> optax.GradientTransformation:
    """AdamW; `total_updates` counts optimizer updates (steps x epochs x minibatches)."""
    parts = []
    if optim.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(optim.grad_clip))
    parts.append(
        optax.adamw(
            learning_rate(optim, total_updates), b1=optim.b1, b2=optim.b2,
            weight_decay=optim.weight_decay,
        )
    )
    return optax.chain(*parts)


def frozen_reference(params: Any, dtype: Any) -> Any:
    """The frozen reference policy (π_ref, also PRM+GSPO's base) from the base params: its
    matrices in the compute `dtype` where that is narrower (`sampling.compute_weights`: the
    same log-probs, bit for bit, in half the bytes with bf16 compute), every leaf in buffers
    of its own (the policy's are donated to its updates). Placed like `params`. Not part of
    a checkpoint (`TrainState`): a run resumed from any checkpoint rebuilds it from the base."""
    return jax.tree.map(lambda a, b: jnp.copy(b) if a is b else b, params,
                        compute_weights(params, dtype))


def init_state(params: Any, optimizer: optax.GradientTransformation) -> TrainState:
    return TrainState(params=params, opt_state=optimizer.init(params),
                      step=jnp.zeros((), jnp.int32))


def policy_params(options: Any, ref_params: Any, params: Any) -> Any:
    """The policy's full params from π_ref's and the trained ones: with LoRA
    (`options.lora_rank` > 0) the frozen base (which is π_ref) with the trained adapters
    overlaid (`lora.merge`, no copies); else the trained params are the whole policy."""
    return lora.merge(ref_params, params) if options.lora_rank else params


def lora_adapters(cfg: RunConfig, base: Any, mesh: Mesh) -> Any:
    """The run's fresh LoRA adapters of `base`, created directly on their shards (key: the
    run's seed, its own stream)."""
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), base)  # no consts
    make = lambda: lora.init(shapes, rank=cfg.model.lora.rank,
                             targets=lora.parse_targets(cfg.model.lora.targets),
                             key=jax.random.fold_in(jax.random.key(cfg.seed), 0x10A))
    return jax.jit(make, out_shardings=sharding.param_shardings(jax.eval_shape(make), mesh))()


def initial_state(cfg: RunConfig, base: Any, dtype: Any, optimizer: optax.GradientTransformation,
                  mesh: Mesh) -> tuple[Any, TrainState, Any]:
    """(π_ref's params, the train state on `mesh`, the state's shardings) from the base
    params. Full fine-tuning: the state trains the base's own buffers, π_ref is
    `frozen_reference`. LoRA (`model.lora.rank` > 0): the state holds only the adapters and
    their optimizer moments; π_ref is the base itself (frozen, its param dtype), no copy."""
    if cfg.model.lora.rank:
        ref, state = base, init_state(lora_adapters(cfg, base, mesh), optimizer)
    else:
        ref, state = frozen_reference(base, dtype), init_state(base, optimizer)
    # Every leaf on the mesh (optimizer counters replicated), and the update keeps these
    # layouts: a state that came back with other specs would recompile the next step.
    shardings = jax.tree.map(lambda x: x.sharding if isinstance(x.sharding, NamedSharding)
                             else NamedSharding(mesh, P()), state)
    return ref, jax.device_put(state, shardings), shardings
