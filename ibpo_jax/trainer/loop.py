"""The RL loop: prompts -> G rollouts each -> rewards -> φ -> advantages -> updates -> metrics,
with periodic evaluation and checkpoints, resuming from the latest checkpoint of a workdir.

Per step, only reward scoring leaves the device: the sampled tokens are copied to the host to be
decoded and scored, then `step.credit` (φ on device) and `step.update` run back to back on
device arrays (the sampler's own outputs among them).
Everything the next step depends on is a function of (seed, step) and the checkpointed state,
so a run killed at any point and restarted reproduces the uninterrupted run's metrics.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ibpo_jax import models
from ibpo_jax import rewards as rewards_lib
from ibpo_jax.config import RunConfig
from ibpo_jax.data.sampler import IndexSampler
from ibpo_jax.models import hf_io, lora
from ibpo_jax.runtime import sharding
from ibpo_jax.trainer import batching, evaluation, hooks, packing, pg_variance, policy, rounds, step
from ibpo_jax.trainer import collect as collect_lib
from ibpo_jax.trainer import dynamic as dynamic_lib
from ibpo_jax.trainer import offpolicy as offpolicy_lib
from ibpo_jax.trainer import step_records as records_lib
from ibpo_jax.trainer import workdir as workdir_lib
from ibpo_jax.trainer.checkpoint import Checkpointer
from ibpo_jax.trainer.collect import Collected
from ibpo_jax.trainer.logs import RunLog, read_metrics, summary_table
from ibpo_jax.trainer.run_tasks import (
    build_task,  # noqa: F401 - loop.build_task and loop.default_split: evaluate, benchmarks
    build_tokenizer,
    default_split,  # noqa: F401
    train_and_eval_tasks,
)
from ibpo_jax.trainer.state import initial_state, make_optimizer, policy_params


def reward_pool(cfg: RunConfig, name: str) -> rewards_lib.RewardPool:
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


class Trainer:
    """Everything one run holds: tasks, policy and reference, compiled step functions, reward
    pools, the methods the config turns on (`trainer.hooks.Methods`), data position and train
    state. `run` drives it; benchmarks call `rl_step` directly."""

    def __init__(self, cfg: RunConfig, workdir: str | Path, *, log=None):
        self.cfg = cfg
        self.workdir = Path(workdir).absolute()
        self.is_main = jax.process_index() == 0
        self.say = log or (functools.partial(print, flush=True) if self.is_main
                           else (lambda *_: None))
        self.mesh, self.rollout_mesh = offpolicy_lib.meshes(cfg.mesh)  # one object unless split
        self.tokenizer = build_tokenizer(cfg)
        self.task, self.eval_task, eval_split = train_and_eval_tasks(cfg, self.tokenizer)
        self._build_policy()
        self.train_records = self.task.split(cfg.task.train_split)
        self.eval_records = evaluation.problems(cfg, self.eval_task, eval_split)
        # Every process draws the same global batch (same seed, same position), so host
        # arrays are identical everywhere and each process places its own devices' rows.
        self.order = IndexSampler(len(self.train_records), seed=cfg.seed)
        self.generate, self.eval_generate = self._samplers()
        self.rollouts = offpolicy_lib.Rollouts(  # where and when the sampler runs
            cfg.rollout, steps=cfg.train.steps, meshes=(self.mesh, self.rollout_mesh),
            dtype=self.base.options.dtype, sampler=self.generate, data=self.order,
            collect=self.collect, policy=lambda: self.policy, keys=self.keys)
        self.is_delim = jnp.asarray(self.tokenizer.is_delim)
        self._build_update()
        self.seed_key = jax.random.key(cfg.seed)
        self.budget = 0.0  # budget_trajectories so far (DESIGN §6), checkpointed
        self.pool = reward_pool(cfg, self.task.reward)
        self.eval_pool = (self.pool if self.eval_task.reward == self.task.reward
                          else reward_pool(cfg, self.eval_task.reward))
        self.collector = collect_lib.Collector(
            cfg, self.mesh, self.task, self.tokenizer, self.train_records, self.order,
            self.rollouts.generate, self.pool, self.packer)
        self.methods = hooks.Methods(self.context())  # prepared in `run`

    def _build_policy(self) -> None:
        """The base policy and its frozen reference, the step's spec and optimizer, and the
        train state on the mesh."""
        cfg = self.cfg
        from ibpo_jax import plan  # "auto" resolved, and a CPU run's memory checked, first

        mb = plan.startup_microbatches(cfg, self.mesh, log=self.say)
        self.base = policy.load_base(cfg, task=self.task, tokenizer=self.tokenizer,
                                     mesh=self.mesh, log=self.say)
        if self.is_main:  # which base this run's numbers are relative to (README, records)
            self.workdir.mkdir(parents=True, exist_ok=True)
            (self.workdir / "base.json").write_text(json.dumps(
                policy.base_identity(cfg, self.tokenizer.vocab_size)) + "\n")
        self.spec = step.StepSpec.from_config(cfg, self.base.config, self.base.options)
        if mb != cfg.optim.microbatches:  # "auto", or micro_batch_rows: resolved here
            self.say(f"micro-batches per update: {mb}")
            self.spec = self.spec.with_optim(microbatches=mb)
        total_updates = cfg.train.steps * cfg.optim.epochs * cfg.optim.minibatches
        self.optimizer = make_optimizer(cfg.optim, total_updates=total_updates)
        # Full: the policy takes the base's buffers (updates donate them), π_ref a copy with
        # matrices in the compute dtype. LoRA: the state is the adapters, π_ref the base.
        ref, self.state, self.state_shardings = initial_state(
            cfg, self.base.params, self.base.options.dtype, self.optimizer, self.mesh)
        self.base = dataclasses.replace(self.base, params=ref)

    @property
    def policy(self) -> Any:
        """The policy's full params (LoRA: the frozen base with the trained adapters)."""
        return policy_params(self.base.options, self.base.params, self.state.params)

    def _build_update(self) -> None:
        """How update rows are packed, and the step's two jitted programs."""
        # Packed update rows (trainer/packing.py) with optim.layout "packed", unless a
        # cancellation transform needs each group's rows together; packed-row counts split
        # into the minibatch x micro-batch chunks, each over the mesh's batch devices when the
        # batch allows. Otherwise the identity plan (whole groups).
        cfg = self.cfg
        packed, multiple = self.spec.layout == "packed", 1
        if packed:
            rows = cfg.rows_per_step
            chunks = cfg.optim.minibatches * self.spec.optim.microbatches
            devices = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
            multiple = chunks * devices if rows % (chunks * devices) == 0 else chunks
        elif self.spec.layout != cfg.optim.layout:  # RunConfig.update_layout decided
            self.say("update: rows unpacked (cancellation.transform needs whole groups)")
        self.packer = packing.Packer(self.mesh, cfg.rollout.group_size, packed, multiple)
        self.credit_fn, self.update_fn = step.step_functions(self.spec, self.optimizer,
                                                             self.state_shardings)
        # loss.kl_in "reward": π_ref's pass before `credit` (none at β = 0 or for "loss")
        self.reward_kl_fn = (jax.jit(functools.partial(step.reward_kl, self.spec))
                             if self.spec.kl_in_reward else None)

    def _samplers(self) -> tuple[Any, Any]:
        """The rollout's sampler (G samples per prompt) and evaluation's (eval.samples)."""
        make = functools.partial(batching.sampler, self.cfg, self.base.config,
                                 self.base.options, self.tokenizer)
        return (make(self.rollout_mesh, num_samples=self.cfg.rollout.group_size),
                make(self.mesh, num_samples=self.cfg.eval.samples, evaluation=True))

    def context(self) -> hooks.Context:
        """What the run's methods see of it: never the trainer itself."""
        return hooks.Context(
            cfg=self.cfg, mesh=self.mesh, tokenizer=self.tokenizer, task=self.task,
            eval_task=self.eval_task, train_records=self.train_records, model=self.base.config,
            options=self.base.options, base_params=self.base.params, is_delim=self.is_delim,
            pool=self.pool, eval_pool=self.eval_pool, workdir=self.workdir,
            is_main=self.is_main)

    def restore(self, ckpt: Checkpointer) -> int | None:
        """Restores the newest intact checkpoint, if any, and records the run's config
        (workdir.resume: config checks, fallback past damaged checkpoints); returns its step."""
        found = workdir_lib.resume(ckpt, self.cfg, self.state, self.workdir, log=self.say,
                                   record=self.is_main)
        if found is None:
            return None
        last, self.state, meta = found
        self.order.restore(meta["data_position"])
        self.rollouts.restored(meta, lambda: ckpt.arrays(last))  # a pending batch: replayed
        # Checkpoints from before the weighted budget counted B x G per step.
        self.budget = float(meta.get("budget_trajectories",
                                     last * self.cfg.rows_per_step))
        self.say(f"resumed from {ckpt.directory}/{last} (data position {self.order.position})")
        return last

    def save(self, ckpt: Checkpointer, s: int) -> None:
        ckpt.save(s, self.state, *self.rollouts.saved({  # (record, pending batch's arrays)
            "step": s, "data_position": self.order.position,
            "budget_trajectories": self.budget, "config": self.cfg.to_dict()}))

    def evaluate(self, log: RunLog | None = None, step: int = 0) -> dict[str, float]:
        """Held-out metrics; with `log`, config.logging.samples samples to it at `step`."""
        shown = None if log is None else []
        with jax.set_mesh(self.mesh):
            out = evaluation.run(self.cfg, self.eval_generate, self.policy,
                                 records=self.eval_records, task=self.eval_task,
                                 tokenizer=self.tokenizer, pool=self.eval_pool,
                                 second=self.methods.answer(self.policy), shown=shown)
        if shown:
            log.samples(step, self.eval_task.name, shown)
        return out

    def rl_step(self, s: int) -> tuple[dict[str, float], dict[str, dict]]:
        """RL step `s` (1-based): `collect` (sample -> score; off-policy, the batch sampled
        during the previous update: trainer/offpolicy.py) then `learn` on what it got.
        Updates the state; returns the step's metrics and its rows of the record files
        (`logs.RECORDS`, by file name)."""
        gen_key, update_key = self.keys(s)
        return self.rollouts.step(s, gen_key, lambda got: self.learn(s, got, gen_key,
                                                                    update_key))

    def keys(self, s: int) -> jax.Array:
        """Step `s`'s (sampling, update) keys: functions of (seed, s) alone."""
        with jax.set_mesh(self.mesh):  # keys placed like evaluation's: one sampler compile
            return jax.random.split(jax.random.fold_in(self.seed_key, s))

    def collect(self, gen_key: jax.Array, params: Any = None) -> Collected:
        """The step's batch (`collect.Collector.collect`) under `params`, the policy's by
        default."""
        return self.collector.collect(gen_key, self.policy if params is None else params)

    def learn(self, s: int, got: Collected, gen_key: jax.Array, update_key: jax.Array
              ) -> tuple[dict[str, float], dict[str, dict]]:
        """The methods' reward shaping and extra round -> credit (φ, advantages) -> update ->
        metrics, on the batch `collect` returned."""
        g = self.cfg.rollout.group_size
        self.budget += got.sampled  # off-policy: sampled during the previous step
        t2 = time.perf_counter()
        batch, stages = self.methods.shape(hooks.Scored(
            s, got.records, got.rollout, got.rows, got.infos, self.policy))
        extra = self.extra_round(batch, jax.random.fold_in(gen_key, 1), stages)

        cred, credit_metrics = self.credit(batch.rollout)
        diag, logged = self.diagnostics(s, batch, cred, got.prompts)
        rollout, update_cred, plan = self.joined(batch.rollout, cred, got.plan, extra)
        rollout = dynamic_lib.update_rows(self.cfg, rollout)  # reward.overlong "filter"
        with jax.set_mesh(self.mesh):
            t3 = time.perf_counter()
            self.state, update_metrics = self.update_fn(self.state, self.base.params, rollout,
                                                        update_cred, update_key, plan)
            jax.block_until_ready(self.state)
        t4 = time.perf_counter()

        metrics = {k: float(v) for k, v in
                   jax.device_get({**credit_metrics, **update_metrics}).items()}
        metrics.update(diag)
        metrics.update(records_lib.first_error_agreement(
            cred, batch.rollout, got.rows, got.infos, g))
        metrics.update(stages, **got.stats)
        sampled = sum(got.times.values())
        metrics.update(
            budget_trajectories=self.budget,  # DESIGN §6: every sampled trajectory, weighted
            prompts_truncated=got.prompts.truncated,
            update_tokens_frac=self.update_tokens_frac(
                plan, (rollout.prompt.shape[0] // g, rollout.prompt.shape[1]),
                rollout.response.shape),
            # Every round's tokens over every round's time (dynamic sampling's dropped too).
            tokens_per_s=got.stats.get("tokens_sampled", int(got.lengths.sum()))
            / (sampled + t4 - t2),
            time_phi_s=t3 - t2 - diag.get("time_pg_var_s", 0.0)
            - stages.get("time_second_round_s", 0.0), time_update_s=t4 - t3, **got.times,
        )
        return metrics, logged

    def extra_round(self, batch: hooks.Scored, key: jax.Array, metrics: dict[str, float]
                    ) -> tuple[rounds.FirstRound, rounds.Round] | None:
        """The methods' extra round of this step, if any (`Methods.extend`): charges its cost
        to the budget and adds its metrics and time to `metrics`."""
        t0 = time.perf_counter()
        extra = self.methods.extend(batch, key)
        if extra is not None:
            self.budget += extra[1].cost
            metrics.update(extra[1].metrics, time_second_round_s=time.perf_counter() - t0)
        return extra

    def credit(self, rollout: step.Rollout) -> tuple[step.Credit, dict[str, Any]]:
        """φ and the advantages of `rollout`'s rows (`step.credit`), and their statistics;
        with loss.kl_in "reward", β·KL to π_ref comes off their rewards first."""
        with jax.set_mesh(self.mesh):
            if self.reward_kl_fn is not None:
                rollout = rollout._replace(kl_penalty=self.reward_kl_fn(self.base.params, rollout))
            cred, metrics = self.credit_fn(rollout, self.is_delim)
            jax.block_until_ready(cred)
        return cred, metrics

    def joined(self, rollout: step.Rollout, cred: step.Credit, plan: packing.Packing,
               extra: tuple[rounds.FirstRound, rounds.Round] | None
               ) -> tuple[step.Rollout, step.Credit, packing.Packing]:
        """The update's rows, credit and packing plan: the first round's, then (`extra`) the
        extra round's, credited within its own groups."""
        if extra is None:
            return rollout, cred, plan
        first, rnd = extra
        second, _ = self.credit(rounds.place(rnd.rows, self.mesh))
        rollout = rounds.joined(first, rnd.rows, self.mesh, self.tokenizer.pad_id, rnd.kl_anchor)
        cred = rounds.joined_credit(cred, second, train_first=rnd.train_first)
        plan = self.packer.plan(*(sharding.host_array(x) for x in (
            rollout.prompt_len, rollout.response_len)), *rollout.prompt.shape[1:],
            *rollout.response.shape[1:])
        return rollout, cred, plan

    def diagnostics(self, s: int, batch: hooks.Scored, cred: step.Credit, prompts: Any
                    ) -> tuple[dict[str, float], dict[str, dict]]:
        """At diagnostic steps (`diagnose`), Appendix A's diagnostics of the first round at the
        policy that sampled it: the policy-gradient variance metrics, and the step's row of
        appendix_a.jsonl (by file name)."""
        if not self.diagnose(s):
            return {}, {}
        diag = self.pg_variance(batch.rollout, cred,
                                np.repeat(prompts.lengths, self.cfg.rollout.group_size),
                                prompts.tokens.shape[1])
        return diag, {"appendix_a.jsonl": records_lib.appendix_a(s, cred, batch.rollout,
                                                              batch.rows, batch.infos)}

    def diagnose(self, s: int) -> bool:
        """Appendix A's diagnostics at step 1 and every diagnostics.grad_var_every steps."""
        every = self.cfg.diagnostics.grad_var_every
        return every > 0 and (s == 1 or s % every == 0)

    @functools.cached_property
    def pg_var_fn(self):
        """Compiled on first use only: runs with the diagnostics off never build it."""
        return jax.jit(functools.partial(pg_variance.measure, self.spec))

    def pg_variance(self, rollout: step.Rollout, cred: step.Credit, prompt_len: np.ndarray,
                    prompt_width: int) -> dict[str, float]:
        """DESIGN §3's policy-gradient variance of this batch, with the run's λ and with 0."""
        t0 = time.perf_counter()
        plan = self.packer.plan(prompt_len, prompt_len, prompt_width, 0, whole_groups=True)
        with jax.set_mesh(self.mesh):
            out = self.pg_var_fn(self.state._replace(params=self.policy), self.base.params,
                                 rollout, cred, plan, self.is_delim)
        out = {k: float(v) for k, v in jax.device_get(out).items()}
        return {**out, "time_pg_var_s": time.perf_counter() - t0}

    def update_tokens_frac(self, plan: packing.Packing, prompt_shape: tuple[int, int],
                           response_shape: tuple[int, int]) -> float:
        """Token positions the update's model passes run, over those of the rollout's own
        [N, P + R] rows."""
        (b, p), (n, r) = prompt_shape, response_shape
        if self.spec.layout == "grouped":
            return (b * p + n * r) / (n * (p + r))
        return plan.rows / n

    def export_hf(self, path: Path) -> None:
        """The policy as an HF checkpoint transformers uses as is, tokenizer and generation
        config included (every process calls it: gathers are collective). LoRA: the adapters
        merged into the weights, and also as a PEFT adapter under `path`/peft_adapter."""
        alpha = self.base.options.lora_alpha
        models.save_hf(models.Qwen3LM(self.base.config, self.base.options, lora.fold(
            self.policy, alpha)), path, config_extra=hf_io.special_ids(self.tokenizer))
        hf_io.save_tokenizer(self.tokenizer, path)
        if self.base.options.lora_rank:
            lora.save_peft(self.state.params, path / "peft_adapter", alpha=alpha,
                           dropout=self.base.options.lora_dropout)

    def close(self) -> None:
        self.rollouts.close()
        self.pool.close()
        if self.eval_pool is not self.pool:
            self.eval_pool.close()


def run(cfg: RunConfig, *, workdir: str | Path) -> list[dict]:
    """Trains per `cfg`, writing outputs under `workdir` (locked for this run alone; a changed
    config is refused before anything is built); returns the metrics rows. SIGINT / SIGTERM
    stop it after the current step with a checkpoint: raises `workdir.RunStopped`."""
    with (workdir_lib.RunLock(workdir, enabled=jax.process_index() == 0),
          workdir_lib.StopRequest() as stop):
        workdir_lib.check_latest_config(Path(workdir) / "checkpoints", cfg)
        return _run(cfg, workdir=workdir, stop=stop)


def _run(cfg: RunConfig, *, workdir: str | Path, stop: workdir_lib.StopRequest) -> list[dict]:
    trainer = Trainer(cfg, workdir)
    workdir = trainer.workdir
    ckpt = Checkpointer(workdir / "checkpoints", every=cfg.train.checkpoint_every,
                        keep=cfg.train.keep_checkpoints)
    log = None
    try:
        last = trainer.restore(ckpt)
        log = RunLog.for_run(cfg, workdir, last_step=-1 if last is None else last,
                             is_main=trainer.is_main)
        # Wall time over the run's segments: a resumed run continues its logged total.
        done = [r for r in read_metrics(workdir / "metrics.jsonl") if r["step"] <= (last or 0)]
        t_start = time.perf_counter() - (done[-1].get("time_total_s", 0.0) if done else 0.0)
        # The methods' stage before RL (PRM+GSPO: its PRM fitted, or reloaded), budgeted.
        cost, fitted = trainer.methods.prepare(last is None, log.info)
        trainer.budget += cost if last is None else 0.0
        if last is None:
            log.info("evaluating the base policy")
            log.write(0, {**trainer.evaluate(log), **fitted,
                          "budget_trajectories": trainer.budget,
                          "time_total_s": time.perf_counter() - t_start})
        stall = workdir_lib.StallGuard(cfg.optim.epochs * cfg.optim.minibatches)
        for s in range(1 if last is None else last + 1, cfg.train.steps + 1):
            metrics, logged = trainer.rl_step(s)
            for name, row in logged.items():
                log.record(name, row)
            final = s == cfg.train.steps or 0 < cfg.train.budget <= metrics["budget_trajectories"]
            if s % cfg.train.eval_every == 0 or final:
                metrics.update(trainer.evaluate(log, s))
            metrics["time_total_s"] = time.perf_counter() - t_start
            log.write(s, metrics)
            stall.check(s, metrics)  # logged first: the rows show the skipped updates
            stopping = stop.requested() and not final  # a signal: this step is the last
            if ckpt.should_save(s, last=final or stopping):
                trainer.save(ckpt, s)
            if stopping:
                raise workdir_lib.RunStopped(stop.signum, s, ckpt.path(s))
            if final:
                break
        trainer.export_hf(workdir / "hf_final")
    finally:
        if log is not None:
            log.close()
        ckpt.close()
        trainer.close()

    rows = read_metrics(workdir / "metrics.jsonl")
    evals = [r for r in rows if "eval_accuracy" in r]
    if trainer.is_main and evals:
        table = summary_table(evals[0], evals[-1], [r for r in rows if r["step"] > 0])
        (workdir / "summary.md").write_text(table + "\n")
        trainer.say(table)
    return rows

