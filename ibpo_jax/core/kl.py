"""Per-token KL estimators (`registry.KL_ESTIMATORS`, config `loss.kl_estimator`; DESIGN §4).

Each is k(logp, ref_logp) -> [B, T] on tokens y_t ~ π_θ, with u = logπ_ref - logπ_θ clamped to
±LOG_RATIO_CLAMP (Schulman 2020, "Approximating KL divergence"). What an estimator gives depends
on where the KL goes (`loss.kl_in`); over the support of a categorical π (tests/core/test_losses.py
checks every entry exactly against autodiff of the exact KLs):

  estimator  E_π[k] (value)       "loss": E_π[∇k] (pathwise)   "reward": E_π[sg(k) ∇logπ_θ]
  k1         KL(π‖π_ref)          0                            ∇KL(π‖π_ref)
  k2         ½E[u²] (biased)      ∇KL(π‖π_ref)                 (no KL's gradient)
  k3         KL(π‖π_ref)          ∇KL(π_ref‖π)                 ∇KL(π‖π_ref) - ∇KL(π_ref‖π)
  low_var    ≤ KL (k3 ≤ 10)       as k3 where k3 < 10, else 0   as k3 where k3 ≤ 10

("reward": the score-function gradient of -β·k as a reward, the sampled token's k, no gradient
through k itself.) So for the reverse KL's gradient put k2 in the loss or k1 in the reward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ibpo_jax.config.registry import KL_ESTIMATORS

LOG_RATIO_CLAMP = 20.0
LOW_VAR_CAP = 10.0  # verl's "low_var_kl" bound on k3


def _u(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """u = logπ_ref - logπ_θ, clamped (a clamped token carries no gradient)."""
    return jnp.clip(ref_logp - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """k1 = logπ_θ - logπ_ref = -u, [B, T].

    Value: unbiased for KL(π_θ ‖ π_ref) on samples from π_θ (can be negative per token).
    Gradient as a loss term: ∇logπ_θ, whose expectation under π_θ is 0 (no KL pull at all);
    as a reward -β·k1 (score function): E[k1 ∇logπ_θ] = ∇ KL(π_θ ‖ π_ref), the unbiased
    reverse-KL gradient.
    """
    return -_u(logp, ref_logp)


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """k2 = ½ (logπ_θ - logπ_ref)², [B, T].

    Gradient (logπ_θ - logπ_ref) ∇logπ_θ, whose expectation under π_θ is ∇ KL(π_θ ‖ π_ref): the
    unbiased reverse-KL gradient as a loss term (its value is only a second-order KL estimate).
    """
    return 0.5 * jnp.square(logp - ref_logp)


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """Default. k3 = exp(u) - u - 1, u = logπ_ref - logπ_θ (clamped to ±LOG_RATIO_CLAMP), [B, T].

    Value: ≥ 0, unbiased for KL(π_θ ‖ π_ref) on samples from π_θ. Gradient: ∂k3/∂logπ_θ =
    1 - π_ref/π_θ, whose expectation under π_θ is -Σ_y π_ref ∇logπ_θ = ∇ KL(π_ref ‖ π_θ): as a loss
    term k3 follows the forward (mass-covering) KL, not the reverse KL its value estimates.
    """
    u = _u(logp, ref_logp)
    return jnp.exp(u) - u - 1.0


@KL_ESTIMATORS.register("low_var")
def kl_low_var(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """verl's "low_var_kl": k3 bounded to [-10, 10] (k3 ≥ 0, so min(k3, 10)), [B, T].

    Equal to k3 (value and gradient) on tokens with k3 < 10; a token past the bound contributes
    10 and no gradient, so the value is biased low where π_θ and π_ref disagree strongly and the
    gradient there is cut instead of growing like π_ref/π_θ.
    """
    return jnp.minimum(kl_k3(logp, ref_logp), LOW_VAR_CAP)
