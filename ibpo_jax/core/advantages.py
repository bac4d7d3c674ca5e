"""Advantage estimators: group-relative with IBPO shaping (DESIGN §3) and GAE for PPO.

Shapes: G responses per group on the last axis of rewards / φ ([..., G]); T response positions
([..., G, T] for per-token credit, [B, T] for GAE). Group statistics are population moments
unless `ddof` says otherwise.

Degenerate groups. A group whose shaped rewards r̃ are all equal (all correct, all wrong with
equal φ, G = 1) carries no group-relative signal; its advantages are exactly 0, decided by an
explicit equality test rather than by the arithmetic (the float mean of equal values may differ
from them by an ulp, and with ε = 0 that ulp would be blown up to ±1, or 0/0).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from ibpo_jax.config.registry import ESTIMATORS


def _group_stats(shaped: jax.Array, *, ddof: int, valid: jax.Array | None = None
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Returns (mean [..., 1], std [..., 1], constant [..., 1] bool) over the last axis, over
    the `valid` members only when given (groups of varying size padded to G, e.g. the
    corrections of DESIGN §6); a group with fewer than two valid members is constant."""
    if valid is None:
        valid = jnp.ones(shaped.shape, bool)
    count = jnp.sum(valid, axis=-1, keepdims=True).astype(jnp.float32)
    mean = jnp.sum(jnp.where(valid, shaped, 0.0), axis=-1, keepdims=True) / jnp.maximum(count, 1)
    first = jnp.take_along_axis(shaped, jnp.argmax(valid, axis=-1)[..., None], axis=-1)
    constant = jnp.all(~valid | (shaped == first), axis=-1, keepdims=True)
    centered = jnp.where(constant | ~valid, 0.0, shaped - mean)
    # max(., 1): only G <= ddof reaches it, and such a group (G = 1) is constant anyway.
    var = jnp.sum(centered**2, axis=-1, keepdims=True) / jnp.maximum(count - ddof, 1)
    return mean, jnp.sqrt(var), constant


def _normalize(
    centered: jax.Array, std: jax.Array, constant: jax.Array, *, normalize_std: bool, eps: float
) -> jax.Array:
    if normalize_std:
        denom = std + eps
        ok = denom > 0  # false only with eps = 0 and an underflowing spread
        centered = jnp.where(ok, centered / jnp.where(ok, denom, 1.0), 0.0)
    return jnp.where(constant, 0.0, centered)


def _check_group_args(rewards: jax.Array, phi: jax.Array, *, eps: float, ddof: int) -> None:
    if rewards.shape != phi.shape:
        raise ValueError(f"rewards {rewards.shape} and phi {phi.shape} must have the same shape")
    if rewards.ndim < 1:
        raise ValueError("rewards must have a group axis [..., G]; got a scalar")
    if ddof < 0 or eps < 0:
        raise ValueError(f"ddof ({ddof}) and eps ({eps}) must be >= 0")


# What an estimator takes, so that `advantage.estimator` can name any entry (DESIGN §3):
# "group": (rewards, phi [..., G], *, lam, normalize_std, eps, ddof, valid) -> [..., G];
# "token": the same plus per-token credit delta [..., G, T] -> [..., G, T] (ibpo.credit=token);
# "value": GAE's (rewards, values, mask [B, T], gamma, lam), with PPO's value head.
TAKES = ("group", "token", "value")


def takes(kind: str) -> Callable[[Callable], Callable]:
    """Marks an estimator's kind (unmarked: "group")."""
    if kind not in TAKES:
        raise ValueError(f"estimator kind {kind!r}; valid: {', '.join(TAKES)}")

    def mark(fn: Callable) -> Callable:
        fn.takes = kind
        return fn

    return mark


def estimator_kind(fn: Callable) -> str:
    """"group", "token" or "value": what `fn` takes (TAKES)."""
    return getattr(fn, "takes", "group")


@ESTIMATORS.register("grpo")
def group_advantages(
    rewards: jax.Array,
    phi: jax.Array,
    *,
    lam: float,
    normalize_std: bool = True,
    eps: float = 1e-6,
    ddof: int = 0,
    valid: jax.Array | None = None,
) -> jax.Array:
    """Group-relative advantage of the shaped reward (eq. 5, eq. 11, DESIGN §3).

    r̃_i = R_i + λ φ_i;  A_i = (r̃_i - mean_g r̃) / (std_g r̃ + ε).

    Args:
      rewards: [..., G] terminal rewards R_i (±1 in the paper).
      phi: [..., G] comparison signal φ_i (0 for correct responses); zeros give plain GRPO/GSPO.
      lam: shaping weight λ (0.5 in the paper).
      normalize_std: False is Dr. GRPO (centering only, no std division).
      eps: added to the std before dividing; 0 is allowed.
      ddof: std convention, population (0) or sample (1).
      valid: [..., G] bool, the group's members (None: all); the others get 0 and do not
        enter the group's mean and std.

    Returns:
      [..., G] float32 advantages; exactly 0 for a group with constant r̃.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    phi = jnp.asarray(phi, jnp.float32)
    _check_group_args(rewards, phi, eps=eps, ddof=ddof)
    shaped = rewards + lam * phi
    mean, std, constant = _group_stats(shaped, ddof=ddof, valid=valid)
    adv = _normalize(shaped - mean, std, constant, normalize_std=normalize_std, eps=eps)
    return adv if valid is None else jnp.where(valid, adv, 0.0)


@ESTIMATORS.register("grpo_token")
@takes("token")
def token_advantages(
    rewards: jax.Array,
    phi: jax.Array,
    delta: jax.Array,
    *,
    lam: float,
    normalize_std: bool = True,
    eps: float = 1e-6,
    ddof: int = 0,
    valid: jax.Array | None = None,
) -> jax.Array:
    """Per-token IBPO credit (paper §3.3 "Δ_t", DESIGN §3, `ibpo.credit="token"`).

    A_it = (R_i + λ Δ_it - mean_g r̃) / (std_g r̃ + ε), with the group statistics of the
    sequence-level r̃ = R + λφ, so with Δ_it = φ_i for all t this is `group_advantages`
    broadcast over T. A group with constant r̃ gets 0 everywhere (as in `group_advantages`;
    dividing Δ_it - φ_i by ε alone would give ~1e6-sized credit).

    Args:
      rewards: [..., G]; phi: [..., G]; delta: [..., G, T] per-token credit Δ_it (0 on padding).
      lam, normalize_std, eps, ddof, valid: as in `group_advantages`.

    Returns:
      [..., G, T] float32 advantages. Padding positions hold the value of Δ = 0 there; mask them.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    phi = jnp.asarray(phi, jnp.float32)
    delta = jnp.asarray(delta, jnp.float32)
    _check_group_args(rewards, phi, eps=eps, ddof=ddof)
    if delta.shape[:-1] != rewards.shape:
        raise ValueError(f"delta {delta.shape} must be rewards' shape {rewards.shape} + [T]")
    mean, std, constant = _group_stats(rewards + lam * phi, ddof=ddof, valid=valid)
    centered = rewards[..., None] + lam * delta - mean[..., None]
    adv = _normalize(
        centered, std[..., None], constant[..., None], normalize_std=normalize_std, eps=eps
    )
    return adv if valid is None else jnp.where(valid[..., None], adv, 0.0)


def appendix_a_stats(y: jax.Array, phi: jax.Array, *, lam: float) -> dict[str, jax.Array]:
    """The quantities of Appendix A / Theorem A.2 (unnormalized eqs. 10-11, DESIGN §3).

    With population moments over the group axis:
      A^GSPO_i = Y_i - Ȳ                        (eq. 10)
      A^IBPO_i = A^GSPO_i + λ(φ_i - φ̄)          (eq. 11)
      C = -Cov(Y, φ),  V_φ = Var(φ - φ̄) = Var(φ)
      Var(A^IBPO) = Var(A^GSPO) - 2λC + λ² V_φ

    The last line is an identity (expand the variance of a sum); the paper writes "≤" but it
    holds with equality. Var(A^IBPO) < Var(A^GSPO) iff 0 < λ < 2C / V_φ.

    `lambda_max` = 2C / V_φ when V_φ > 0, and 0 when V_φ = 0. V_φ = 0 means φ is constant over the
    group, so C = 0 as well and the variance is unchanged for every λ: no λ > 0 reduces it, and 0
    is also what the paper's guarded 2C / (V_φ + ε) gives. A value <= 0 (also possible when
    Assumption A.1, C > 0, fails) means no positive λ reduces the variance.

    Args:
      y: [..., G] terminal rewards Y_i; phi: [..., G] φ_i; lam: λ.

    Returns:
      dict of [...] float32 arrays: C, V_phi, lambda_max, var_adv_gspo, var_adv_ibpo.
    """
    y = jnp.asarray(y, jnp.float32)
    phi = jnp.asarray(phi, jnp.float32)
    _check_group_args(y, phi, eps=0.0, ddof=0)
    adv_gspo = y - jnp.mean(y, axis=-1, keepdims=True)
    phi_c = phi - jnp.mean(phi, axis=-1, keepdims=True)
    adv_ibpo = adv_gspo + lam * phi_c
    c = -jnp.mean(adv_gspo * phi_c, axis=-1)
    v_phi = jnp.mean(phi_c**2, axis=-1)
    pos = v_phi > 0
    return {
        "C": c,
        "V_phi": v_phi,
        "lambda_max": jnp.where(pos, 2.0 * c / jnp.where(pos, v_phi, 1.0), 0.0),
        "var_adv_gspo": jnp.var(adv_gspo, axis=-1),
        "var_adv_ibpo": jnp.var(adv_ibpo, axis=-1),
    }


def pooled_appendix_a(y: jax.Array, phi: jax.Array, *, lam: float) -> dict[str, jax.Array]:
    """Appendix A's moments pooled over a batch of groups (DESIGN §3, version 2).

    Within-group moments are summed over the groups and divided by the total count:
      Cov(Y, φ) = Σ_b Σ_i (Y_bi - Ȳ_b)(φ_bi - φ̄_b) / (B·G),  V_φ likewise,
      λ_max = 2C / V_φ = -2 Σ_b Cov_b / Σ_b V_b   (the counts cancel).
    Not the mean of per-group ratios: a group with V_φ = 0 (no mixed outcome) adds nothing to
    either sum instead of a 0 that drags the average down. Theorem A.2 then holds for the pooled
    variance: Σ_b Var_b(A^IBPO) < Σ_b Var_b(A^GSPO) iff 0 < λ < λ_max.

    Args:
      y: [..., G] terminal rewards; phi: [..., G]; lam: λ. Every leading axis is pooled.

    Returns:
      dict of float32 scalars: cov_y_phi, V_phi, lambda_max (0 when V_φ = 0), var_adv_gspo,
      var_adv_ibpo (both pooled: mean of the per-group variances).
    """
    s = appendix_a_stats(y, phi, lam=lam)
    c, v = jnp.mean(s["C"]), jnp.mean(s["V_phi"])
    pos = v > 0
    return {
        "cov_y_phi": -c,
        "V_phi": v,
        "lambda_max": jnp.where(pos, 2.0 * c / jnp.where(pos, v, 1.0), 0.0),
        "var_adv_gspo": jnp.mean(s["var_adv_gspo"]),
        "var_adv_ibpo": jnp.mean(s["var_adv_ibpo"]),
    }


@ESTIMATORS.register("gae")
@takes("value")
def gae(
    *,
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimation for PPO with a value head (DESIGN §3).

    δ_t = r_t + γ V_{t'} - V_t and A_t = δ_t + γλ A_{t'}, where t' is the next valid position
    after t; after the last valid token the bootstrap value and advantage are 0 (the response
    is over). Invalid positions are skipped, not treated as zero-reward steps, so interior gaps
    in the mask do not cut the recursion.

    Args:
      rewards: [B, T] float, per-token rewards (the terminal r̃ at the last valid token, plus
        any per-token penalty).
      values: [B, T] float, value-head predictions V(s_t) (treated as constants).
      mask: [B, T] bool/0-1, valid response tokens (incl. EOS).
      gamma: discount γ (DESIGN: 1). lam: GAE λ.

    Returns:
      (advantages [B, T], returns [B, T]) float32, returns = advantages + values; both 0 on
      invalid positions.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    values = jax.lax.stop_gradient(jnp.asarray(values, jnp.float32))
    if rewards.ndim != 2 or values.shape != rewards.shape or jnp.shape(mask) != rewards.shape:
        raise ValueError(
            f"rewards {rewards.shape}, values {values.shape} and mask {jnp.shape(mask)} must all "
            "be the same [B, T]"
        )
    valid = jnp.asarray(mask).astype(bool)

    def step(carry, xs):
        next_value, next_adv = carry
        r, v, m = xs
        adv = r + gamma * next_value - v + gamma * lam * next_adv
        carry = (jnp.where(m, v, next_value), jnp.where(m, adv, next_adv))
        return carry, jnp.where(m, adv, 0.0)

    zeros = jnp.zeros(rewards.shape[:1], jnp.float32)
    _, adv_t = jax.lax.scan(
        step, (zeros, zeros), (rewards.T, values.T, valid.T), reverse=True
    )
    advantages = adv_t.T
    return advantages, jnp.where(valid, advantages + values, 0.0)


def ppo_advantages(
    *,
    terminal_reward: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: float,
    lam: float,
    whiten: bool,
    eps: float,
    estimator: Callable[..., tuple[jax.Array, jax.Array]] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """PPO's per-token advantages (DESIGN §3): the shaped terminal reward r̃ = R + λφ (eq. 5)
    at each response's last valid token, GAE with γ and λ_GAE (`gae`), then, with `whiten`,
    advantages whitened over the batch's valid tokens: (A - mean) / (std + eps).

    Args:
      terminal_reward: [B] float r̃ per response; values: [B, T] value-head predictions (no
        gradient); mask: [B, T] valid response tokens (a prefix of each row, incl. EOS).
      gamma, lam: GAE's discount and λ; whiten: normalize over the batch; eps: added to std.
      estimator: a "value" estimator with `gae`'s signature (None: `gae`).

    Returns:
      (advantages [B, T], returns [B, T]) float32, 0 on invalid positions; returns are the
      unwhitened advantages plus values (the value head's targets).
    """
    valid = jnp.asarray(mask).astype(bool)
    last = jax.nn.one_hot(jnp.sum(valid, axis=-1) - 1, valid.shape[1]) * valid
    rewards = last * jnp.asarray(terminal_reward, jnp.float32)[:, None]
    adv, returns = (estimator or gae)(rewards=rewards, values=values, mask=valid, gamma=gamma,
                                      lam=lam)
    if whiten:
        n = jnp.maximum(jnp.sum(valid), 1)
        mean = jnp.sum(jnp.where(valid, adv, 0.0)) / n
        var = jnp.sum(jnp.where(valid, jnp.square(adv - mean), 0.0)) / n
        adv = jnp.where(valid, (adv - mean) / (jnp.sqrt(var) + eps), 0.0)
    return adv, returns
