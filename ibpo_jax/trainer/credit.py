"""Credit for one rollout batch: φ (DESIGN §2), advantages (DESIGN §3) and their statistics.

`credit(spec, rollout, is_delim)` is the first of the step's two jitted functions (the other is
`step.update`). Rows are prompt-major: row b*G + g is sample g of prompt b, so [N] reshapes to
[B, G] groups. φ covers each whole response: the unit budget defaults to every unit
(`ibpo.max_units = 0`); a smaller budget is a memory cap whose truncated rows are logged as
`units_truncated_frac`. Shapes: N = B*G rows, P prompt columns, R response columns, U units.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ibpo_jax.config.registry import ESTIMATORS
from ibpo_jax.config.sections import IbpoConfig
from ibpo_jax.core import advantages, comparison
from ibpo_jax.trainer.spec import StepSpec


class Rollout(NamedTuple):
    """One step's samples, rewards included (device arrays, rows prompt-major)."""

    prompt: jax.Array  # [N, P] int32, left-padded
    prompt_len: jax.Array  # [N] int32
    response: jax.Array  # [N, R] int32, right-padded
    response_len: jax.Array  # [N] int32, generated tokens incl. a final EOS
    sample_logp: jax.Array  # [N, R] float32, sampler's log-probs (0 past the length)
    reward: jax.Array  # [N] float32, R_i (DESIGN §1)
    correct: jax.Array  # [N] bool
    ended: jax.Array  # [N] bool, the response ends with EOS (else truncated)
    # Rows that belong to their group (None: all). Corrections (DESIGN §6) fill a [B, G] slot
    # layout, slot g of group b being the correction of response g; the empty slots are
    # invalid: no advantage, no group statistics, no tokens.
    valid: jax.Array | None = None  # [N] bool
    # Per-row weight of an extra KL(π ‖ π_ref) term on the row's tokens (None: none), e.g.
    # SCoRe's stage-I anchor on the first attempts (DESIGN §7).
    kl_anchor: jax.Array | None = None  # [N] float32
    # β·KL(π_sampler ‖ π_ref) of each row, taken off R before the advantages (config
    # loss.kl_in = "reward", `step.reward_kl`; None: none). φ and the metrics read R itself.
    kl_penalty: jax.Array | None = None  # [N] float32
    # What three operators read of the checker, the task and the policy (`step_labels`,
    # `vouch`, set by the trainer only for them; the update never reads them): the checker's
    # first wrong step, a step index (-1: none), for "checker"; the task's canonical step ids
    # and their count, for "peer_steps" and "vouched_steps"; the steps a right completion
    # vouches for, for "vouched_steps".
    step_truth: jax.Array | None = None  # [N] int32
    step_ids: jax.Array | None = None  # [N, U] int32
    step_ids_len: jax.Array | None = None  # [N] int32
    step_vouched: jax.Array | None = None  # [N] int32


class Credit(NamedTuple):
    phi: jax.Array  # [B, G] float32
    first_error: jax.Array  # [B, G] int32, units kept before the first error (wrong rows)
    shaped: jax.Array  # [B, G] float32, r̃ = R + λφ (eq. 5)
    adv: jax.Array  # [N] or [N, R] advantages (group estimators); zeros for PPO (GAE later)


def response_mask(lengths: jax.Array, width: int) -> jax.Array:
    return jnp.arange(width)[None, :] < lengths[:, None]  # [N, R]


def groups(x: jax.Array, g: int) -> jax.Array:
    """[N, ...] -> [N / g, g, ...]."""
    return x.reshape(x.shape[0] // g, g, *x.shape[1:])


def phi_scored(correct: jax.Array) -> jax.Array:
    """correct [B, G] -> [B, G]: the wrong responses of groups with a correct one, the only
    responses φ scores (elsewhere φ = 0 by definition)."""
    return ~correct & jnp.any(correct, -1, keepdims=True)


def trained_reward(rollout: Rollout) -> jax.Array:
    """[N] the reward the advantages see: R, less `kl_penalty` when there is one."""
    return rollout.reward if rollout.kl_penalty is None else rollout.reward - rollout.kl_penalty


def group_advantages(spec: StepSpec, rollout: Rollout, phi: jax.Array,
                     delta: jax.Array | None = None) -> jax.Array:
    """The group estimator's advantages [N] (or [N, R] with per-token credit `delta` [N, R]:
    the run's "token" estimator); zeros for a "value" estimator (PPO's GAE), which needs the
    value head (`step.with_advantages`). Without `delta` under token credit: grpo, the
    sequence-level advantages the metrics report."""
    estimator = ESTIMATORS.get(spec.estimator)
    if advantages.estimator_kind(estimator) == "value":
        return jnp.zeros_like(rollout.reward)
    g, rewards = spec.group_size, groups(trained_reward(rollout), spec.group_size)
    kw = dict(lam=spec.ibpo.lam, normalize_std=spec.advantage.normalize_std,
              eps=spec.advantage.eps, ddof=spec.advantage.ddof,
              valid=None if rollout.valid is None else groups(rollout.valid, g))
    if delta is not None:
        adv = estimator(rewards, phi, groups(delta, g), **kw)
        return adv.reshape(rollout.response.shape)
    if advantages.estimator_kind(estimator) != "group":
        estimator = ESTIMATORS.get("grpo")
    return estimator(rewards, phi, **kw).reshape(-1)


def response_units(spec: StepSpec, rollout: Rollout, is_delim: jax.Array
                   ) -> comparison.Units:
    """The units φ compares (steps or tokens, `ibpo.granularity`) of every response."""
    return comparison.response_units(rollout.response, rollout.response_len, rollout.ended,
                                     is_delim, granularity=spec.ibpo.granularity,
                                     max_units=spec.ibpo.max_units or None)


def checker_truth(spec: StepSpec, rollout: Rollout, is_delim: jax.Array) -> jax.Array:
    """[N] int32: the checker's first wrong step (`Rollout.step_truth`) in the comparison's
    units: the step index itself, or (granularity "token") the tokens before that step's first
    token; -1 where the checker names none."""
    if rollout.step_truth is None:
        raise ValueError("ibpo.operator='checker': this batch carries no checker labels "
                         "(Rollout.step_truth); extra rounds (corrections, SCoRe) do not")
    truth = rollout.step_truth.astype(jnp.int32)
    if spec.ibpo.granularity == "step":
        return truth
    length = (rollout.response_len - rollout.ended.astype(jnp.int32)).astype(jnp.int32)
    step = jax.vmap(lambda t, n: comparison.token_unit_index(t, n, is_delim))(
        rollout.response, length)  # [N, R]: leading delimiters -1, i.e. before every step
    live = jnp.arange(step.shape[1])[None, :] < length[:, None]
    before = jnp.sum(live & (step < truth[:, None]), axis=1)
    return jnp.where(truth >= 0, before, -1).astype(jnp.int32)


def vouched_steps(rollout: Rollout) -> jax.Array:
    """[N] int32: the steps a right completion vouches for (`Rollout.step_vouched`)."""
    if rollout.step_vouched is None:
        raise ValueError("ibpo.operator='vouched_steps': this batch carries no completion "
                         "labels (Rollout.step_vouched); extra rounds (corrections, SCoRe) and "
                         "the base-policy probes do not")
    return rollout.step_vouched.astype(jnp.int32)


def compared_units(ibpo: IbpoConfig, rollout: Rollout, u: comparison.Units
                   ) -> tuple[jax.Array, jax.Array]:
    """(units [N, U], [N] bool rows that fell back): the units φ compares. "peer_steps" and
    "vouched_steps" with the task's canonical step ids (`Rollout.step_ids`) compare those,
    except on a row whose step count differs from the tokens' (`step_labels`), which keeps its
    hashed steps."""
    if (ibpo.operator not in comparison.CANONICAL or rollout.step_ids is None
            or ibpo.granularity != "step"):
        return u.units, jnp.zeros(u.n_units.shape, bool)
    same = rollout.step_ids_len == u.n_units
    return jnp.where(same[:, None], rollout.step_ids, u.units), ~same


def credit(spec: StepSpec, rollout: Rollout, is_delim: jax.Array) -> tuple[Credit, dict]:
    """φ, advantages and the group statistics of Appendix A for one rollout batch."""
    g, ibpo = spec.group_size, spec.ibpo
    u = response_units(spec, rollout, is_delim)
    units, fallback = compared_units(ibpo, rollout, u)
    truth = (groups(checker_truth(spec, rollout, is_delim), g)
             if ibpo.operator in comparison.NEEDS_TRUTH else None)
    vouched = (groups(vouched_steps(rollout), g)
               if ibpo.operator in comparison.NEEDS_VOUCHED else None)
    phi_out = jax.vmap(lambda units, n, c, t, v: comparison.compute_phi(
        units, n, c, operator=ibpo.operator, alignment=ibpo.alignment, reduce=ibpo.reduce,
        truth=t, vouched=v))(groups(units, g), groups(u.n_units, g), groups(rollout.correct, g),
                             truth, vouched)
    phi = phi_out.phi  # [B, G]
    delta = None
    if ibpo.credit == "token" and not spec.is_ppo:  # Δ whose token mean is φ (DESIGN §2)
        delta = comparison.token_delta(phi_out.delta.reshape(-1, u.units.shape[1]),
                                       phi.reshape(-1), u.token_unit, rollout.response_len)
    adv = group_advantages(spec, rollout, phi, delta)
    shaped = groups(trained_reward(rollout), g) + ibpo.lam * phi
    metrics = credit_metrics(rollout, phi, spec)
    if rollout.kl_penalty is not None:
        metrics["kl_reward"] = live_mean(rollout.kl_penalty, rollout.valid)
    metrics["units_truncated_frac"] = live_mean(u.truncated.astype(jnp.float32), rollout.valid)
    if rollout.step_ids is not None and ibpo.operator in comparison.CANONICAL:
        metrics["canonical_fallback_frac"] = live_mean(fallback.astype(jnp.float32),
                                                       rollout.valid)
    if not spec.is_ppo:
        seq_adv = adv if delta is None else group_advantages(spec, rollout, phi)
        metrics.update(where_credit_goes(rollout, adv, seq_adv, phi_out.first_error.reshape(-1),
                                         u.token_unit, g))
    return Credit(phi, phi_out.first_error, shaped, adv), metrics


def where_credit_goes(rollout: Rollout, adv: jax.Array, seq_adv: jax.Array,
                      first_error: jax.Array, token_unit: jax.Array, g: int
                      ) -> dict[str, jax.Array]:
    """Where a batch's credit lands on the wrong responses that φ scores (issue 16).

    adv: [N] or [N, R] the update's advantages; seq_adv [N] the sequence-level ones (eq. 5,
    the same without per-token Δ); first_error [N] units before the first error; token_unit
    [N, R] each token's unit. Returns `adv_mass_before_error`: the share of those responses'
    Σ_t |A_t| (each token's coefficient on ∇log π before the aggregation's row weight) on
    tokens before the first error; `adv_mean_before_error` / `adv_mean_after_error`: the mean
    advantage there; `adv_sign_flip_frac`: the share of all response tokens whose advantage
    sign differs from their response's sequence-level advantage (0 without token credit).
    """
    mask = _live_tokens(rollout)
    tok = jnp.broadcast_to(adv if adv.ndim == 2 else adv[:, None], mask.shape)
    before, after = error_sides(rollout, first_error, token_unit, g)
    mass = lambda m: jnp.sum(jnp.where(m, jnp.abs(tok), 0.0))
    mean = lambda m: jnp.sum(jnp.where(m, tok, 0.0)) / jnp.maximum(jnp.sum(m), 1)
    flips = mask & (jnp.sign(tok) != jnp.sign(seq_adv)[:, None])
    return {
        "adv_mass_before_error": mass(before) / jnp.maximum(mass(before) + mass(after), 1e-30),
        "adv_mean_before_error": mean(before),
        "adv_mean_after_error": mean(after),
        "adv_sign_flip_frac": jnp.sum(flips) / jnp.maximum(jnp.sum(mask), 1),
    }


def _live_tokens(rollout: Rollout) -> jax.Array:
    mask = response_mask(rollout.response_len, rollout.response.shape[1])  # [N, R]
    return mask if rollout.valid is None else mask & rollout.valid[:, None]


def error_sides(rollout: Rollout, first_error: jax.Array, token_unit: jax.Array, g: int
                ) -> tuple[jax.Array, jax.Array]:
    """([N, R], [N, R]) bool: the tokens of the wrong responses φ scores that lie before their
    first error (first_error [N] units), and those at or after it."""
    mask = _live_tokens(rollout)
    scored = phi_scored(groups(rollout.correct, g)).reshape(-1)[:, None] & mask
    # token_unit -1: no unit (EOS, leading delimiters); -2: past the unit budget (after).
    fe = first_error[:, None]
    before = scored & (token_unit >= 0) & (token_unit < fe)
    after = scored & ((token_unit >= fe) | (token_unit == -2))
    return before, after


def live_mean(x: jax.Array, live: jax.Array | None) -> jax.Array:
    """x's mean over the entries `live` selects (same shape, bool; None: all, `jnp.mean`)."""
    if live is None:
        return jnp.mean(x)
    return jnp.sum(jnp.where(live, x, 0.0)) / jnp.maximum(jnp.sum(live), 1)


def pooled_moments(y: jax.Array, phi: jax.Array, *, lam: float, live: jax.Array | None
                   ) -> dict[str, jax.Array]:
    """`advantages.pooled_appendix_a` of y, phi [B, G] over the groups `live` [B] selects
    (None: all): the others made constant, so their within-group moments are 0, and the pooled
    means rescaled from B groups to the live ones (λ_max, a ratio of two of them, unchanged)."""
    if live is None:
        return advantages.pooled_appendix_a(y, phi, lam=lam)
    keep = lambda x: jnp.where(live[:, None], x, 0.0)
    pooled = advantages.pooled_appendix_a(keep(y), keep(phi), lam=lam)
    scale = live.shape[0] / jnp.maximum(jnp.sum(live), 1)
    return {k: v if k == "lambda_max" else v * scale for k, v in pooled.items()}


def credit_metrics(rollout: Rollout, phi: jax.Array, spec: StepSpec) -> dict[str, jax.Array]:
    """Rewards, φ and Appendix A's pooled moments of the batch (DESIGN §3): of its valid rows
    and the groups holding one (`Rollout.valid`; dynamic sampling's fillers are left out)."""
    g, live = spec.group_size, rollout.valid
    y = groups(rollout.reward, g)
    v = jnp.ones(y.shape, bool) if live is None else groups(live, g)
    correct = groups(rollout.correct, g) & v
    live_groups = None if live is None else jnp.any(v, -1)
    # φ is defined: some (valid) responses right, some wrong
    mixed = jnp.any(correct, -1) & jnp.any(~correct & v, -1)
    wrong_scored = phi_scored(correct) & v
    pooled = pooled_moments(y, phi, lam=spec.ibpo.lam, live=live_groups)
    lengths = rollout.response_len.astype(jnp.float32)
    reward_mean = live_mean(rollout.reward, live)
    return {
        "reward_mean": reward_mean,
        "reward_var": jnp.var(rollout.reward) if live is None
        else live_mean(jnp.square(rollout.reward - reward_mean), live),
        "accuracy": live_mean(rollout.correct.astype(jnp.float32), live),
        # mean φ over the responses φ scores
        "phi_mean": jnp.sum(jnp.where(wrong_scored, phi, 0.0))
        / jnp.maximum(jnp.sum(wrong_scored), 1),
        "cov_y_phi": pooled["cov_y_phi"],
        "lambda_max": pooled["lambda_max"],
        # Unnormalized Var(A) of eqs. 11 / 10: their gap is algebra (a sanity check); the claim
        # is about the policy-gradient variance (`pg_var*`, trainer/pg_variance.py).
        "adv_var": pooled["var_adv_ibpo"],
        "adv_var_gspo": pooled["var_adv_gspo"],
        "frac_groups_all_same": live_mean(1.0 - mixed.astype(jnp.float32), live_groups),
        "response_len_mean": live_mean(lengths, live),
        "frac_truncated": live_mean(1.0 - rollout.ended.astype(jnp.float32), live),
    }
