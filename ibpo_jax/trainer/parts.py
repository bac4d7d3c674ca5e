"""The built parts of a run, in one frozen value (`RunParts`), and `build`, which makes them.

Everything here is fixed once built: the meshes, tokenizer and tasks, the base policy (π_ref),
the step's spec, optimizer and compiled programs, the samplers, the collector with its
schedule, the verifiers and the methods the config turns on. What changes during a run is
the train state and the budget (`trainer/loop.py` holds them), plus the few stateful parts a
frozen value points to: the data position (`order`), the sampler placement's copies and a
pending off-policy batch (`schedule`). The RL step is a function over these
(`trainer/rl_step.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from ibpo_jax import models
from ibpo_jax import rewards as rewards_lib
from ibpo_jax.config import RunConfig
from ibpo_jax.core import comparison
from ibpo_jax.data.sampler import IndexSampler
from ibpo_jax.data.tasks import Task
from ibpo_jax.sampler import sampling
from ibpo_jax.trainer import batching, evaluation, hooks, packing, pg_variance, policy, step
from ibpo_jax.trainer import collect as collect_lib
from ibpo_jax.trainer import offpolicy as offpolicy_lib
from ibpo_jax.trainer import partial as partial_lib
from ibpo_jax.trainer import vouch as vouch_lib
from ibpo_jax.trainer.run_tasks import build_tokenizer, train_and_eval_tasks
from ibpo_jax.trainer.state import TrainState, initial_state, make_optimizer, policy_params


def reward_pool(cfg: RunConfig, name: str) -> rewards_lib.RewardPool:
    """The verifier `name` (or reward.name) in a pool of reward.num_workers processes."""
    name, options = cfg.reward.name or name, {}
    if name == "code":  # strict (the default) refuses to start where a sandbox layer is missing
        options["sandbox"] = rewards_lib.code.require_sandbox(cfg.reward.sandbox)
        if jax.process_index() == 0:
            print(rewards_lib.code.sandbox_summary(cfg.reward.sandbox), file=sys.stderr,
                  flush=True)
    reward = rewards_lib.get_reward(name, values=(cfg.reward.wrong, cfg.reward.correct),
                                    **options)
    pool = rewards_lib.RewardPool(reward, num_workers=cfg.reward.num_workers,
                                  timeout_s=cfg.reward.timeout_s)
    return offpolicy_lib.Serialized(pool) if cfg.rollout.off_policy_steps else pool  # 2 threads


@dataclasses.dataclass(frozen=True)
class RunParts:
    """What one run is built from (module docstring)."""

    cfg: RunConfig
    workdir: Path
    is_main: bool  # process 0: writes files, prints
    say: Callable[..., None]
    mesh: Mesh  # the training mesh (the rollout mesh: `schedule.placement`)
    tokenizer: Any  # data.tokenizer: HF or CharTokenizer
    task: Task
    eval_task: Task
    train_records: Sequence[dict]
    eval_records: list[dict]
    order: IndexSampler  # the data position (stateful; checkpointed)
    base: models.Qwen3LM  # π_ref: with LoRA also the frozen base the adapters ride on
    spec: step.StepSpec
    optimizer: optax.GradientTransformation
    state_shardings: Any
    packer: packing.Packer
    credit_fn: Callable  # (rollout, is_delim) -> (Credit, metrics): `step.credit`
    update_fn: Callable  # (state, ref, rollout, credit, key, plan) -> (state, metrics)
    reward_kl_fn: Callable | None  # loss.kl_in "reward": π_ref's pass before credit
    generate: sampling.GenerateFn  # the rollout's sampler (G samples per prompt)
    eval_generate: sampling.GenerateFn  # evaluation's (eval.samples)
    schedule: offpolicy_lib.Schedule  # when collecting runs: on-, one step off-policy, partial
    collector: collect_lib.Collector
    pool: Any  # the training task's verifier (rewards.RewardPool)
    eval_pool: Any
    is_delim: jax.Array  # [V] bool: the tokens that end a reasoning step
    seed_key: jax.Array
    methods: hooks.Methods | None  # built last, from the parts' `context` (`build`)

    def policy(self, state: TrainState) -> Any:
        """The policy's full params (LoRA: the frozen base with the trained adapters)."""
        return policy_params(self.base.options, self.base.params, state.params)

    def keys(self, s: int) -> jax.Array:
        """Step `s`'s (sampling, update) keys: functions of (seed, s) alone."""
        with jax.set_mesh(self.mesh):  # keys placed like evaluation's: one sampler compile
            return jax.random.split(jax.random.fold_in(self.seed_key, s))

    @functools.cached_property
    def pg_var_fn(self) -> Callable:
        """Compiled on first use only: runs with the diagnostics off never build it."""
        return jax.jit(functools.partial(pg_variance.measure, self.spec))

    def context(self) -> hooks.Context:
        """What the run's methods see of it (never the parts themselves)."""
        return hooks.Context(
            cfg=self.cfg, mesh=self.mesh, tokenizer=self.tokenizer, task=self.task,
            eval_task=self.eval_task, train_records=self.train_records,
            model=self.base.config, options=self.base.options, base_params=self.base.params,
            is_delim=self.is_delim, pool=self.pool, eval_pool=self.eval_pool,
            workdir=self.workdir, is_main=self.is_main)

    def close(self) -> None:
        self.schedule.close()
        self.pool.close()
        if self.eval_pool is not self.pool:
            self.eval_pool.close()


def _vouch(cfg: RunConfig, make: Callable[..., Any], mesh: Mesh, tokenizer: Any
           ) -> vouch_lib.Vouch | None:
    """ibpo.operator "vouched_steps": its continuations' sampler on the training mesh (`make`:
    the run's sampler factory) and settings (trainer/vouch.py); None for the other operators."""
    if cfg.ibpo.operator not in comparison.NEEDS_VOUCHED:
        return None
    return vouch_lib.build(cfg.ibpo, cfg.rollout, make(mesh, num_samples=cfg.ibpo.completions),
                           tokenizer)


def build(cfg: RunConfig, workdir: str | Path, *, log: Callable[..., None] | None = None
          ) -> tuple[RunParts, TrainState]:
    """The run's parts and its initial train state, in the order they depend on each other:
    meshes -> tokenizer and tasks -> policy, reference and step programs -> samplers ->
    collector and schedule -> verifiers -> methods."""
    workdir, is_main = Path(workdir).absolute(), jax.process_index() == 0
    say = log or (functools.partial(print, flush=True) if is_main else (lambda *_: None))
    mesh, rollout_mesh = offpolicy_lib.meshes(cfg.mesh)  # one object unless split
    tokenizer = build_tokenizer(cfg)
    task, eval_task, eval_split = train_and_eval_tasks(cfg, tokenizer)
    base, spec, optimizer, state, state_shardings = _policy(cfg, mesh, task, tokenizer,
                                                            workdir, is_main, say)
    train_records = task.split(cfg.task.train_split)
    # Every process draws the same global batch (same seed, same position), so host arrays
    # are identical everywhere and each process places its own devices' rows.
    order = IndexSampler(len(train_records), seed=cfg.seed)
    make = functools.partial(batching.sampler, cfg, base.config, base.options, tokenizer)
    generate = make(rollout_mesh, num_samples=cfg.rollout.group_size,
                    refill_slots=cfg.rollout.refill)
    eval_generate = make(mesh, num_samples=cfg.eval.samples, evaluation=True)
    placement = offpolicy_lib.Placement(cfg.rollout, meshes=(mesh, rollout_mesh),
                                        dtype=base.options.dtype, sampler=generate)
    packer = _packer(cfg, spec, mesh, say)
    credit_fn, update_fn = step.step_functions(spec, optimizer, state_shardings)
    pool = reward_pool(cfg, task.reward)
    eval_pool = pool if eval_task.reward == task.reward else reward_pool(cfg, eval_task.reward)
    is_delim = jnp.asarray(tokenizer.is_delim)
    flight = None
    if cfg.rollout.partial:  # its rounds: T tokens a row, each row a prompt of its own
        t, refill = cfg.rollout.round_tokens, cfg.rollout.refill
        flight = partial_lib.InFlight(
            cfg, mesh=rollout_mesh, pad_id=tokenizer.pad_id,
            first=make(rollout_mesh, num_samples=cfg.rollout.group_size, refill_slots=refill,
                       max_new_tokens=t),
            sampler=make(rollout_mesh, num_samples=1, refill_slots=refill, max_new_tokens=t),
            is_eos=lambda ids: np.isin(ids, tokenizer.eos_ids))
    collector = collect_lib.Collector(cfg, mesh, task, tokenizer, train_records, order,
                                      placement.generate, pool, packer, flight,
                                      _vouch(cfg, make, mesh, tokenizer))
    schedule = (partial_lib.Partial(placement, flight) if flight is not None
                else offpolicy_lib.schedule(cfg.rollout, placement, order))
    parts = RunParts(
        cfg=cfg, workdir=workdir, is_main=is_main, say=say, mesh=mesh, tokenizer=tokenizer,
        task=task, eval_task=eval_task, train_records=train_records,
        eval_records=evaluation.problems(cfg, eval_task, eval_split), order=order, base=base,
        spec=spec, optimizer=optimizer, state_shardings=state_shardings, packer=packer,
        credit_fn=credit_fn, update_fn=update_fn,
        reward_kl_fn=(jax.jit(functools.partial(step.reward_kl, spec))
                      if spec.kl_in_reward else None),
        generate=generate, eval_generate=eval_generate,
        schedule=schedule, collector=collector,
        pool=pool, eval_pool=eval_pool, is_delim=is_delim, seed_key=jax.random.key(cfg.seed),
        methods=None)
    return dataclasses.replace(parts, methods=hooks.Methods(parts.context())), state


def _policy(cfg: RunConfig, mesh: Mesh, task: Task, tokenizer: Any, workdir: Path,
            is_main: bool, say: Callable[..., None]) -> tuple[Any, ...]:
    """(π_ref with its config, the step's spec, optimizer, the train state on the mesh and
    its shardings)."""
    from ibpo_jax import plan  # "auto" resolved, and a CPU run's memory checked, first

    mb = plan.startup_microbatches(cfg, mesh, log=say)
    base = policy.load_base(cfg, task=task, tokenizer=tokenizer, mesh=mesh, log=say)
    if is_main:  # which base this run's numbers are relative to (README, records)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "base.json").write_text(json.dumps(
            policy.base_identity(cfg, tokenizer.vocab_size)) + "\n")
    spec = step.StepSpec.from_config(cfg, base.config, base.options)
    if mb != cfg.optim.microbatches:  # "auto", or micro_batch_rows: resolved here
        say(f"micro-batches per update: {mb}")
        spec = spec.with_optim(microbatches=mb)
    total_updates = cfg.train.steps * cfg.optim.epochs * cfg.optim.minibatches
    optimizer = make_optimizer(cfg.optim, total_updates=total_updates)
    # Full: the policy takes the base's buffers (updates donate them), π_ref a copy with
    # matrices in the compute dtype. LoRA: the state is the adapters, π_ref the base.
    ref, state, state_shardings = initial_state(cfg, base.params, base.options.dtype,
                                                optimizer, mesh)
    return dataclasses.replace(base, params=ref), spec, optimizer, state, state_shardings


def _packer(cfg: RunConfig, spec: step.StepSpec, mesh: Mesh, say: Callable[..., None]
            ) -> packing.Packer:
    """How update rows are packed: packed rows (trainer/packing.py) with optim.layout
    "packed", unless a cancellation transform needs each group's rows together; packed-row
    counts split into the minibatch x micro-batch chunks, each over the mesh's batch devices
    when the batch allows. Otherwise the identity plan (whole groups)."""
    packed, multiple = spec.layout == "packed", 1
    if packed:
        rows = cfg.rows_per_step
        chunks = cfg.optim.minibatches * spec.optim.microbatches
        devices = mesh.shape["data"] * mesh.shape["fsdp"]
        multiple = chunks * devices if rows % (chunks * devices) == 0 else chunks
    elif spec.layout != cfg.optim.layout:  # RunConfig.update_layout decided
        say("update: rows unpacked (cancellation.transform needs whole groups)")
    return packing.Packer(mesh, cfg.rollout.group_size, packed, multiple)
