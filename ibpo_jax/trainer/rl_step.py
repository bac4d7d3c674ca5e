"""One RL step, read top to bottom: collect -> the methods' shaping and extra round -> credit
(φ, advantages) -> update -> metrics, as functions over the run's parts (`parts.RunParts`) and
its train state.

    collect     `schedule.take`: the next prompts, G samples each, scored by the verifier
                (dynamic sampling's rounds inside `collect.Collector`; off-policy, the batch
                sampled during the previous update)
    shape       the methods' reward shaping (`hooks.Methods.shape`) and extra round
    credit      φ and the advantages of the first round's rows (`step.credit`; with
                loss.kl_in "reward", β·KL off the rewards first)
    update      the update's rows (the extra round's joined), `step.update`
    metrics     what the step logs, and Appendix A's records at diagnostic steps

Only scoring leaves the device: the sampled tokens are copied to the host to be decoded and
scored, then credit and update run back to back on device arrays. A step is a function of
(seed, step), the train state and the data position, so a resumed run repeats the
uninterrupted one.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import jax
import numpy as np

from ibpo_jax.runtime import sharding
from ibpo_jax.trainer import dynamic, hooks, packing, rounds, step
from ibpo_jax.trainer import step_records as records_lib
from ibpo_jax.trainer.collect import Collected
from ibpo_jax.trainer.parts import RunParts
from ibpo_jax.trainer.state import TrainState


class StepResult(NamedTuple):
    state: TrainState  # after the update
    budget: float  # budget_trajectories after the step (DESIGN §6)
    metrics: dict[str, float]
    logged: dict[str, dict]  # the step's rows of the record files (`logs.RECORDS`), by name


def rl_step(run: RunParts, state: TrainState, budget: float, s: int) -> StepResult:
    """RL step `s` (1-based) from `state` with `budget` trajectories spent so far."""
    t0 = time.perf_counter()
    gen_key, update_key = run.keys(s)
    # The next step's key: only a schedule that collects beside the update uses it.
    overlaps = run.schedule.overlaps and s < run.cfg.train.steps
    next_key = run.keys(s + 1)[0] if overlaps else None
    got, scheduled = run.schedule.take(run.collector, gen_key, next_key, run.policy(state))
    out = learn(run, state, budget, s, got, gen_key, update_key)
    out.metrics.update(scheduled)
    if run.schedule.overlaps:  # phases overlap: the step's wall time is not their sum
        out.metrics["time_step_s"] = time.perf_counter() - t0
    if run.schedule.placement.split:
        out.metrics["time_reshard_s"] = run.schedule.placement.reshard_s
    return out


def learn(run: RunParts, state: TrainState, budget: float, s: int, got: Collected,
          gen_key: jax.Array, update_key: jax.Array) -> StepResult:
    """Everything of step `s` after collecting, on the batch `got`."""
    g = run.cfg.rollout.group_size
    budget += got.sampled  # off-policy: sampled during the previous step
    t2 = time.perf_counter()
    params = run.policy(state)
    batch, stages = run.methods.shape(hooks.Scored(
        s, got.records, got.rollout, got.rows, got.infos, params))
    extra, cost = extra_round(run, batch, jax.random.fold_in(gen_key, 1), stages)
    budget += cost

    cred, credit_metrics = credit(run, batch.rollout)
    diag, logged = diagnostics(run, state, s, batch, cred, got.prompts)
    rollout, update_cred, plan = joined(run, batch.rollout, cred, got.plan, extra)
    rollout = dynamic.update_rows(run.cfg, rollout)  # reward.overlong "filter"
    with jax.set_mesh(run.mesh):
        t3 = time.perf_counter()
        state, update_metrics = run.update_fn(state, run.base.params, rollout, update_cred,
                                              update_key, plan)
        jax.block_until_ready(state)
    t4 = time.perf_counter()

    metrics = {k: float(v) for k, v in
               jax.device_get({**credit_metrics, **update_metrics}).items()}
    metrics.update(diag)
    metrics.update(records_lib.first_error_agreement(cred, batch.rollout, got.rows, got.infos,
                                                     g))
    metrics.update(stages, **got.stats)
    sampled = sum(got.times.values())
    metrics.update(
        budget_trajectories=budget,  # DESIGN §6: every sampled trajectory, weighted
        prompts_truncated=got.prompts.truncated,
        update_tokens_frac=update_tokens_frac(
            run, plan, (rollout.prompt.shape[0] // g, rollout.prompt.shape[1]),
            rollout.response.shape),
        # Every round's tokens over every round's time (dynamic sampling's dropped too).
        tokens_per_s=got.stats.get("tokens_sampled", int(got.lengths.sum()))
        / (sampled + t4 - t2),
        time_phi_s=t3 - t2 - diag.get("time_pg_var_s", 0.0)
        - stages.get("time_second_round_s", 0.0), time_update_s=t4 - t3, **got.times,
    )
    return StepResult(state, budget, metrics, logged)


def extra_round(run: RunParts, batch: hooks.Scored, key: jax.Array, metrics: dict[str, float]
                ) -> tuple[tuple[rounds.FirstRound, rounds.Round] | None, float]:
    """The methods' extra round of this step, if any (`Methods.extend`), and its cost in
    trajectories; adds its metrics and time to `metrics`."""
    t0 = time.perf_counter()
    extra = run.methods.extend(batch, key)
    if extra is None:
        return None, 0.0
    metrics.update(extra[1].metrics, time_second_round_s=time.perf_counter() - t0)
    return extra, extra[1].cost


def credit(run: RunParts, rollout: step.Rollout) -> tuple[step.Credit, dict[str, Any]]:
    """φ and the advantages of `rollout`'s rows (`step.credit`), and their statistics;
    with loss.kl_in "reward", β·KL to π_ref comes off their rewards first."""
    with jax.set_mesh(run.mesh):
        if run.reward_kl_fn is not None:
            rollout = rollout._replace(kl_penalty=run.reward_kl_fn(run.base.params, rollout))
        cred, metrics = run.credit_fn(rollout, run.is_delim)
        jax.block_until_ready(cred)
    return cred, metrics


def joined(run: RunParts, rollout: step.Rollout, cred: step.Credit, plan: packing.Packing,
           extra: tuple[rounds.FirstRound, rounds.Round] | None
           ) -> tuple[step.Rollout, step.Credit, packing.Packing]:
    """The update's rows, credit and packing plan: the first round's, then (`extra`) the
    extra round's, credited within its own groups."""
    if extra is None:
        return rollout, cred, plan
    first, rnd = extra
    second, _ = credit(run, rounds.place(rnd.rows, run.mesh))
    rollout = rounds.joined(first, rnd.rows, run.mesh, run.tokenizer.pad_id, rnd.kl_anchor)
    cred = rounds.joined_credit(cred, second, train_first=rnd.train_first)
    plan = run.packer.plan(*(sharding.host_array(x) for x in (
        rollout.prompt_len, rollout.response_len)), *rollout.prompt.shape[1:],
        *rollout.response.shape[1:])
    return rollout, cred, plan


def diagnose(run: RunParts, s: int) -> bool:
    """Appendix A's diagnostics at step 1 and every diagnostics.grad_var_every steps."""
    every = run.cfg.diagnostics.grad_var_every
    return every > 0 and (s == 1 or s % every == 0)


def diagnostics(run: RunParts, state: TrainState, s: int, batch: hooks.Scored,
                cred: step.Credit, prompts: Any) -> tuple[dict[str, float], dict[str, dict]]:
    """At diagnostic steps (`diagnose`), Appendix A's diagnostics of the first round at the
    policy that sampled it: the policy-gradient variance metrics, and the step's row of
    appendix_a.jsonl (by file name)."""
    if not diagnose(run, s):
        return {}, {}
    diag = pg_variance(run, state, batch.rollout, cred,
                       np.repeat(prompts.lengths, run.cfg.rollout.group_size),
                       prompts.tokens.shape[1])
    return diag, {"appendix_a.jsonl": records_lib.appendix_a(s, cred, batch.rollout,
                                                          batch.rows, batch.infos)}


def pg_variance(run: RunParts, state: TrainState, rollout: step.Rollout, cred: step.Credit,
                prompt_len: np.ndarray, prompt_width: int) -> dict[str, float]:
    """DESIGN §3's policy-gradient variance of this batch, with the run's λ and with 0."""
    t0 = time.perf_counter()
    plan = run.packer.plan(prompt_len, prompt_len, prompt_width, 0, whole_groups=True)
    with jax.set_mesh(run.mesh):
        out = run.pg_var_fn(state._replace(params=run.policy(state)), run.base.params,
                            rollout, cred, plan, run.is_delim)
    out = {k: float(v) for k, v in jax.device_get(out).items()}
    return {**out, "time_pg_var_s": time.perf_counter() - t0}


def update_tokens_frac(run: RunParts, plan: packing.Packing, prompt_shape: tuple[int, int],
                       response_shape: tuple[int, int]) -> float:
    """Token positions the update's model passes run, over those of the rollout's own
    [N, P + R] rows."""
    (b, p), (n, r) = prompt_shape, response_shape
    if run.spec.layout == "grouped":
        return (b * p + n * r) / (n * (p + r))
    return plan.rows / n
