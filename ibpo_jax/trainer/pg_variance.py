"""Policy-gradient variance across the groups of a batch (DESIGN §3, Appendix A's claim (ii)).

The training loss of a batch is L = Σ_b num_b(θ) / D: each group b adds its own numerator (the
run's aggregation, clipping and KL), and D, the aggregation's normalizer summed over the batch,
does not depend on θ. The gradient restricted to group b is therefore g_b = ∇num_b / D, and
Σ_b g_b = ∇L exactly. Appendix A's "policy-gradient variance" is read here as the trace of the
covariance of these per-group contributions:

    pg_var = Σ_b ‖g_b - ḡ‖² / (B - 1),   ḡ = (1/B) Σ_b g_b,

over the B groups that hold a valid row (`Rollout.valid`: dynamic sampling's filler groups are
no part of the batch's gradient, so no part of its spread either), logged with ‖ḡ‖²
(`pg_mean_sqnorm`) beside it, so a reader can tell a smaller variance from a smaller
gradient. Per-group gradients are accumulated with Welford's update, one group at a time in a
`lax.scan`: memory is two parameter-sized trees, whatever B is, and no cancellation of
Σ‖g_b‖² - B‖ḡ‖² in float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ibpo_jax.core import losses
from ibpo_jax.trainer import credit as credit_lib
from ibpo_jax.trainer import packing, step
from ibpo_jax.trainer.state import TrainState


def _sqnorm(tree: Any) -> jax.Array:
    return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree))


def _vdot(a: Any, b: Any) -> jax.Array:
    return sum(jnp.sum(x.astype(jnp.float32) * y.astype(jnp.float32))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def group_gradient_variance(
    loss_terms: Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]],
    params: Any,
    n_groups: int,
    live: jax.Array | None = None,
) -> dict[str, jax.Array]:
    """PG variance of the per-group gradients of Σ_b num_b / Σ_b den_b.

    Args:
      loss_terms: (params, b) -> (num_b, den_b) for group index b (an int32 scalar): the run's
        own loss numerator restricted to group b, and its share of the normalizer (which must
        not depend on params: its gradient is ignored).
      params: the policy parameters the gradients are taken at.
      n_groups: B >= 2.
      live: [B] bool, the groups that count (None: all). The others (dynamic sampling's
        fillers: no valid row, so num_b = den_b = 0) are skipped, not taken as zero
        gradients: B below is their number, and with fewer than 2 of them pg_var is 0.

    Returns:
      dict of float32 scalars: pg_var (Σ‖g_b - ḡ‖² / (B - 1)), pg_mean_sqnorm (‖ḡ‖²) and
      grad_sum (the tree Σ_b g_b = ∇L, for tests and callers that want it).
    """
    if n_groups < 2:
        raise ValueError(f"policy-gradient variance needs >= 2 groups, got {n_groups}")
    grad_fn = jax.grad(lambda p, b: loss_terms(p, b), has_aux=True)  # -> (∇num_b, den_b)

    def add(carry, b):  # Welford's update with group b, the k-th that counts
        mean, m2, den, k = carry
        g, den_b = grad_fn(params, b)
        k = k + 1.0
        delta = jax.tree.map(lambda x, m: x.astype(jnp.float32) - m, g, mean)
        mean = jax.tree.map(lambda m, d: m + d / k, mean, delta)
        resid = jax.tree.map(lambda x, m: x.astype(jnp.float32) - m, g, mean)
        return mean, m2 + _vdot(delta, resid), den + jax.lax.stop_gradient(den_b), k

    def step(carry, xs):
        b, keep = xs
        if keep is None:
            return add(carry, b), None
        return jax.lax.cond(keep, add, lambda c, _: c, carry, b), None  # a filler: no pass

    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
    init = (zeros, jnp.float32(0.0), jnp.float32(0.0), jnp.float32(0.0))
    (mean, m2, den, k), _ = jax.lax.scan(
        step, init, (jnp.arange(n_groups, dtype=jnp.int32), live))
    inv = jnp.where(den > 0, 1.0 / jnp.where(den > 0, den, 1.0), 0.0)  # g_b = ∇num_b / D
    # k counts the groups that count; one or none: m2 = 0, so pg_var = 0 (no 0 / 0).
    n, dof = (n_groups, n_groups - 1) if live is None else (k, jnp.maximum(k - 1.0, 1.0))
    return {
        "pg_var": m2 * inv**2 / dof,
        "pg_mean_sqnorm": _sqnorm(mean) * inv**2,
        "grad_sum": jax.tree.map(lambda m: m * (n * inv), mean),
    }


def split_gradients(
    loss_terms: Callable[[Any, jax.Array, jax.Array], jax.Array],
    params: Any,
    chunks: jax.Array,
    parts: tuple[jax.Array, ...],
) -> list[Any]:
    """∇num_S for each token set S in `parts`: the part of the batch gradient that flows
    through the log-probs of S's tokens (Σ_S ∇num_S = ∇num when the parts cover every token).

    Args:
      loss_terms: (params, groups [K], through [N, R] bool) -> the loss numerator of those
        groups with the gradient through `through`'s tokens only.
      params: the parameters the gradients are taken at.
      chunks: [C, K] int32 group ids, summed one chunk at a time (the update's working set).
      parts: [N, R] bool token sets.

    Returns: one float32 gradient tree per part, before the loss's normalizer (common to all
    parts, so ratios of their norms are those of the update's gradient).
    """
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
    out = []
    for through in parts:
        grad_fn = jax.grad(lambda p, c, t=through: loss_terms(p, c, t))
        total, _ = jax.lax.scan(lambda acc, c, f=grad_fn: (jax.tree.map(
            lambda a, x: a + x.astype(jnp.float32), acc, f(params, c)), None), zeros, chunks)
        out.append(total)
    return out


def _live_groups(valid: jax.Array | None, g: int) -> jax.Array | None:
    """[B] bool: the groups holding a valid row of `Rollout.valid` [N] (None: all count);
    dynamic sampling's fillers do not."""
    return None if valid is None else jnp.any(credit_lib.groups(valid, g), -1)


def measure(spec: step.StepSpec, state: TrainState, ref_params: Any, rollout: step.Rollout,
            cred: step.Credit, plan: packing.Packing, is_delim: jax.Array
            ) -> dict[str, jax.Array]:
    """DESIGN §3's PG variance of one rollout batch, with the run's λ and with λ = 0.

    Same trajectories, same loss (normalization, aggregation, KL, transform), at the policy
    that sampled them (ratio 1): `pg_var`, `pg_mean_sqnorm` with φ; `pg_var_gspo`,
    `pg_mean_sqnorm_gspo` with GSPO's advantages (φ = 0); `pg_var_ratio` = pg_var /
    pg_var_gspo; `pg_noise_ratio{,_gspo}` = pg_var / pg_mean_sqnorm. With a comparison
    operator (φ finds first errors), `grad_share_before_error{,_gspo}`: of the gradient the
    scored wrong responses' tokens carry, the share ‖g_before‖ / (‖g_before‖ + ‖g_after‖)
    of their tokens before the first error (issue 16: did the credit move there?); `is_delim`
    as for `credit.credit`. `spec` is the run's
    `step.StepSpec` (any layout: the per-group gradients use the "grouped" one), `plan` the
    identity packing plan of the batch (partition unit G). Groups without a valid row
    (`rollout.valid`) are left out. The value loss (PPO) is not part of
    the policy gradient and is left out.
    """
    spec = dataclasses.replace(spec, layout="grouped")
    n_groups = rollout.reward.shape[0] // spec.group_size
    live = _live_groups(rollout.valid, spec.group_size)
    batch, _ = step.prepare_batch(spec, state, ref_params, rollout, cred, plan)
    zero = jnp.zeros_like(cred.phi)
    adv0 = credit_lib.group_advantages(spec, rollout, zero)  # [N]; token credit: Δ = φ = 0
    if cred.adv.ndim == 2:
        adv0 = jnp.broadcast_to(adv0[:, None], cred.adv.shape)
    without_phi = cred._replace(  # GSPO on the same trajectories (DESIGN §3: λ = 0)
        phi=zero, shaped=credit_lib.groups(rollout.reward, spec.group_size), adv=adv0)
    sides = None
    if spec.ibpo.operator != "terminal":
        token_unit = credit_lib.response_units(spec, rollout, is_delim).token_unit
        sides = credit_lib.error_sides(rollout, cred.first_error.reshape(-1), token_unit,
                                       spec.group_size)
        n = spec.optim.minibatches * spec.optim.microbatches
        n = n if n_groups % n == 0 else 1
        chunks = jnp.arange(n_groups, dtype=jnp.int32).reshape(n, -1)
    out = {}
    # φ ≡ 0 (terminal operator): the run's advantages are GSPO's, measured once.
    variants = (("", cred),) if sides is None else (("", cred), ("_gspo", without_phi))
    for suffix, c in variants:
        b = step.with_advantages(spec, batch._replace(adv=c.adv), c)
        r = group_gradient_variance(
            lambda p, g, b=b: step.group_policy_terms(spec, p, b, g), state.params, n_groups,
            live)
        out["pg_var" + suffix] = r["pg_var"]
        out["pg_mean_sqnorm" + suffix] = r["pg_mean_sqnorm"]
        if sides is not None:
            before, after = (jnp.sqrt(_sqnorm(x)) for x in split_gradients(
                lambda p, k, t, b=b: step.group_policy_terms(spec, p, b, k, through=t)[0],
                state.params, chunks, sides))
            out["grad_share_before_error" + suffix] = losses.safe_div(before, before + after)
    if sides is None:
        out |= {"pg_var_gspo": out["pg_var"], "pg_mean_sqnorm_gspo": out["pg_mean_sqnorm"]}
    out["pg_var_ratio"] = losses.safe_div(out["pg_var"], out["pg_var_gspo"])
    # Noise relative to signal: does φ change the gradient's direction-to-noise ratio, or
    # only its size (issue 16)? Scale-free: rescaling every advantage leaves it unchanged.
    for suffix in ("", "_gspo"):
        out["pg_noise_ratio" + suffix] = losses.safe_div(out["pg_var" + suffix],
                                                         out["pg_mean_sqnorm" + suffix])
    return out
