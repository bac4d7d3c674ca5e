"""Tests of ibpo_jax/core/advantages.py against hand-worked numbers and plain-Python references."""

import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibpo_jax.config.registry import ESTIMATORS
from ibpo_jax.core import advantages

# λ is traced (one compilation serves every λ); the rest changes the program.
group_adv = jax.jit(advantages.group_advantages, static_argnames=("normalize_std", "eps", "ddof"))
token_adv = jax.jit(advantages.token_advantages, static_argnames=("normalize_std", "eps", "ddof"))
appendix = jax.jit(advantages.appendix_a_stats)
pooled = jax.jit(advantages.pooled_appendix_a)
gae = jax.jit(advantages.gae, static_argnames=("gamma", "lam"))

# The running example: R = [1, -1, -1, 1], φ = [0, 0.5, 0.2, 0], λ = 0.5.
R = [1.0, -1.0, -1.0, 1.0]
PHI = [0.0, 0.5, 0.2, 0.0]
# r̃ = R + λφ = [1, -0.75, -0.9, 1]; mean = 0.35 / 4 = 0.0875
# deviations = [0.9125, -0.8375, -0.9875, 0.9125]
# squares = [0.83265625, 0.70140625, 0.97515625, 0.83265625], sum = 3.341875
DEV = np.array([0.9125, -0.8375, -0.9875, 0.9125])
SUM_SQ = 3.341875


def test_registered_names():
    assert ESTIMATORS.get("grpo") is advantages.group_advantages
    assert ESTIMATORS.get("grpo_token") is advantages.token_advantages
    assert ESTIMATORS.get("gae") is advantages.gae


@pytest.mark.parametrize("ddof", [0, 1])
def test_group_advantages_by_hand(ddof):
    std = math.sqrt(SUM_SQ / (4 - ddof))  # ddof 0: sqrt(0.83546875); ddof 1: sqrt(1.11395833)
    got = group_adv(jnp.array(R), jnp.array(PHI), lam=0.5, ddof=ddof, eps=1e-6)
    np.testing.assert_allclose(got, DEV / (std + 1e-6), rtol=1e-6)


def test_dr_grpo_only_centers():
    got = group_adv(jnp.array(R), jnp.array(PHI), lam=0.5, normalize_std=False)
    np.testing.assert_allclose(got, DEV, rtol=1e-6)


def test_phi_zero_is_plain_grpo():
    # R = [1, -1, -1, 1]: mean 0, population std 1 -> A = R / (1 + ε).
    got = group_adv(jnp.array(R), jnp.zeros(4), lam=0.5, eps=0.0)
    np.testing.assert_array_equal(got, R)


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("ddof", [0, 1])
def test_constant_groups_are_exactly_zero(eps, normalize_std, ddof):
    kw = dict(lam=0.5, eps=eps, normalize_std=normalize_std, ddof=ddof)
    groups = [
        ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0]),  # all correct
        ([-1.0, -1.0, -1.0], [0.3, 0.3, 0.3]),  # all wrong, same φ
        ([0.1, 0.1, 0.1], [0.0, 0.0, 0.0]),  # float mean of three 0.1s is not 0.1
        ([1.0], [0.0]),  # G = 1
    ]
    for r, phi in groups:
        got = group_adv(jnp.array(r), jnp.array(phi), **kw)
        np.testing.assert_array_equal(got, np.zeros(len(r)))
        delta = np.array(phi)[:, None] + np.array([[0.0, 1.0]])  # Δ differs from φ
        got = token_adv(jnp.array(r), jnp.array(phi), jnp.array(delta), **kw)
        np.testing.assert_array_equal(got, np.zeros((len(r), 2)))


def test_batched_groups_match_one_at_a_time():
    rng = np.random.default_rng(0)
    r = rng.choice([-1.0, 1.0], size=(2, 3, 5))
    phi = np.where(r < 0, rng.uniform(size=r.shape), 0.0)
    phi[0, 0] = 0.0
    r[0, 0] = 1.0  # one constant group in the batch
    got = group_adv(jnp.array(r), jnp.array(phi), lam=0.5)
    for idx in np.ndindex(2, 3):
        want = group_adv(jnp.array(r[idx]), jnp.array(phi[idx]), lam=0.5)
        np.testing.assert_allclose(got[idx], want, rtol=1e-6)
    np.testing.assert_array_equal(got[0, 0], 0.0)
    # The same through vmap over groups (what the trainer does with [B, G] rewards).
    vmapped = jax.jit(jax.vmap(jax.vmap(lambda x, p: advantages.group_advantages(x, p, lam=0.5))))
    np.testing.assert_allclose(vmapped(jnp.array(r), jnp.array(phi)), got, rtol=1e-6)
    delta = np.repeat(phi[..., None], 3, -1)
    vm_tok = jax.jit(jax.vmap(lambda x, p, d: advantages.token_advantages(x, p, d, lam=0.5)))
    np.testing.assert_allclose(vm_tok(jnp.array(r), jnp.array(phi), jnp.array(delta)),
                               np.repeat(np.asarray(got)[..., None], 3, -1), atol=1e-6)


def test_token_advantages_by_hand():
    # R = [1, -1], φ = [0, 0.5] (Δ of response 1 = [1, 1, 0, 0], mean 0.5), λ = 1.
    # r̃ = [1, -0.5], mean 0.25, population std 0.75, ε = 0:
    # A_0t = (1 - 0.25) / 0.75 = 1; A_1t = (-1 + Δ - 0.25) / 0.75 = -1/3 (Δ=1), -5/3 (Δ=0).
    delta = jnp.array([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    got = token_adv(jnp.array([1.0, -1.0]), jnp.array([0.0, 0.5]), delta, lam=1.0, eps=0.0)
    want = [[1.0, 1.0, 1.0, 1.0], [-1 / 3, -1 / 3, -5 / 3, -5 / 3]]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_token_advantages_reduce_to_group_when_delta_is_phi():
    rng = np.random.default_rng(1)
    r = rng.choice([-1.0, 1.0], size=(3, 6))
    phi = np.where(r < 0, rng.uniform(size=r.shape), 0.0)
    delta = np.repeat(phi[..., None], 5, axis=-1)
    for kw in (dict(ddof=0), dict(ddof=1, normalize_std=False)):
        got = token_adv(jnp.array(r), jnp.array(phi), jnp.array(delta), lam=0.5, **kw)
        want = group_adv(jnp.array(r), jnp.array(phi), lam=0.5, **kw)
        np.testing.assert_allclose(got, np.repeat(np.asarray(want)[..., None], 5, -1), atol=1e-6)


def test_appendix_a_by_hand():
    # Ȳ = 0, φ̄ = 0.175, φ - φ̄ = [-0.175, 0.325, 0.025, -0.175]
    # Cov(Y, φ) = (-0.175 - 0.325 - 0.025 - 0.175) / 4 = -0.175 -> C = 0.175
    # V_φ = (0.030625 + 0.105625 + 0.000625 + 0.030625) / 4 = 0.041875
    # λ_max = 0.35 / 0.041875; Var(A^GSPO) = Var(Y) = 1
    # Var(A^IBPO) at λ = 0.5: 1 - 2(0.5)(0.175) + 0.25(0.041875) = 0.83546875, which is also
    # the population variance of r̃ in the group-advantage example above (SUM_SQ / 4).
    s = appendix(jnp.array(R), jnp.array(PHI), lam=0.5)
    np.testing.assert_allclose(s["C"], 0.175, rtol=1e-6)
    np.testing.assert_allclose(s["V_phi"], 0.041875, rtol=1e-6)
    np.testing.assert_allclose(s["lambda_max"], 0.35 / 0.041875, rtol=1e-6)
    np.testing.assert_allclose(s["var_adv_gspo"], 1.0, rtol=1e-6)
    np.testing.assert_allclose(s["var_adv_ibpo"], SUM_SQ / 4, rtol=1e-6)


@given(
    y=hnp.arrays(np.float32, (4, 8), elements=st.sampled_from([-1.0, 1.0])),
    u=hnp.arrays(np.float32, (4, 8), elements=st.floats(0.0625, 1.0, width=32)),
    lam=st.floats(0.0, 3.0),
)
def test_appendix_a_identity_and_theorem(y, u, lam):
    phi = np.where(y < 0, u, 0.0).astype(np.float32)  # Assumption A.1's construction
    s = {k: np.asarray(v) for k, v in appendix(jnp.array(y), jnp.array(phi), lam=lam).items()}
    # Independent numpy moments (population).
    yc, pc = y - y.mean(-1, keepdims=True), phi - phi.mean(-1, keepdims=True)
    np.testing.assert_allclose(s["C"], -(yc * pc).mean(-1), atol=1e-6)
    np.testing.assert_allclose(s["V_phi"], (pc**2).mean(-1), atol=1e-6)
    # Var(A^IBPO) = Var(A^GSPO) - 2λC + λ²V_φ holds with equality.
    rhs = s["var_adv_gspo"] - 2 * lam * s["C"] + lam**2 * s["V_phi"]
    np.testing.assert_allclose(s["var_adv_ibpo"], rhs, atol=1e-5)
    # ... and var_adv_ibpo is the variance of the unnormalized group advantage (Dr. GRPO).
    dr = group_adv(jnp.array(y), jnp.array(phi), lam=lam, normalize_std=False)
    np.testing.assert_allclose(s["var_adv_ibpo"], np.var(np.asarray(dr), -1), atol=1e-5)
    # Theorem A.2 on groups with both outcomes (A.1 holds there: C > 0): the variance is strictly
    # lower for λ in (0, λ_max) and strictly higher beyond. One-outcome groups have C = 0 and
    # λ_max = 0.
    mixed = y.min(-1) < y.max(-1)
    assert np.all(s["C"][mixed] > 0) and np.all(s["lambda_max"][mixed] > 0)
    np.testing.assert_array_equal(s["lambda_max"][~mixed], 0.0)
    # Re-evaluated by the function under test (not by the identity above) at each mixed group's
    # own 0.5·λ_max and 1.5·λ_max.
    for b in np.flatnonzero(mixed):
        for factor, lower in ((0.5, True), (1.5, False)):
            at = appendix(jnp.array(y[b]), jnp.array(phi[b]), lam=factor * s["lambda_max"][b])
            assert (float(at["var_adv_ibpo"]) < float(s["var_adv_gspo"][b])) == lower


def test_lambda_max_guard_when_phi_is_constant():
    # φ constant -> V_φ = 0 and C = 0: λ_max is defined as 0 (no λ > 0 reduces the variance).
    s = appendix(jnp.array([[1.0, -1.0, 1.0], [-1.0, -1.0, -1.0]]), jnp.zeros((2, 3)), lam=0.5)
    np.testing.assert_array_equal(s["lambda_max"], [0.0, 0.0])
    np.testing.assert_array_equal(s["var_adv_ibpo"], s["var_adv_gspo"])
    assert all(np.all(np.isfinite(v)) for v in s.values())


def test_pooled_lambda_max_is_ratio_of_sums_not_mean_of_ratios():
    # Group 0: the running example (C = 0.175, V_φ = 0.041875); group 1: all correct (C = V = 0).
    y = jnp.array([R, [1.0, 1.0, 1.0, 1.0]])
    phi = jnp.array([PHI, [0.0, 0.0, 0.0, 0.0]])
    p = pooled(y, phi, lam=0.5)
    # Pooled: 2·(0.175/2) / (0.041875/2) = 2·0.175 / 0.041875; the mean of per-group ratios
    # (the v1 metric) would be half of that.
    np.testing.assert_allclose(p["lambda_max"], 0.35 / 0.041875, rtol=1e-6)
    np.testing.assert_allclose(p["cov_y_phi"], -0.175 / 2, rtol=1e-6)
    per_group = appendix(y, phi, lam=0.5)["lambda_max"]
    assert abs(float(np.mean(per_group)) - float(p["lambda_max"])) > 1.0


@given(
    y=hnp.arrays(np.float32, (5, 8), elements=st.sampled_from([-1.0, 1.0])),
    u=hnp.arrays(np.float32, (5, 8), elements=st.floats(0.0625, 1.0, width=32)),
)
def test_pooled_theorem_a2(y, u):
    # Theorem A.2 for the pooled variance, re-evaluated at 0.5·λ_max and 1.5·λ_max.
    # As the operators define it: φ > 0 only for wrong responses of groups with a correct one.
    phi = np.where((y < 0) & (y.max(-1, keepdims=True) > 0), u, 0.0).astype(np.float32)
    y, phi = jnp.array(y), jnp.array(phi)
    p = pooled(y, phi, lam=0.0)
    if not np.any(np.asarray(y).min(-1) < np.asarray(y).max(-1)):
        assert float(p["lambda_max"]) == 0.0  # no mixed group: V_φ = 0, λ_max = 0 by definition
        return
    assert float(p["lambda_max"]) > 0 and float(p["cov_y_phi"]) < 0
    below = pooled(y, phi, lam=0.5 * float(p["lambda_max"]))
    above = pooled(y, phi, lam=1.5 * float(p["lambda_max"]))
    assert float(below["var_adv_ibpo"]) < float(p["var_adv_gspo"])
    assert float(above["var_adv_ibpo"]) > float(p["var_adv_gspo"])


def test_pooled_is_finite_without_mixed_groups():
    p = pooled(jnp.ones((3, 4)), jnp.zeros((3, 4)), lam=0.5)
    assert float(p["lambda_max"]) == 0.0 and all(np.isfinite(float(v)) for v in p.values())


def test_gae_by_hand():
    # Row 0, γ = 1, λ = 0.5, values [0.5, 0.2, 0.6], terminal reward 1:
    #   t=2: δ = 1 + 0 - 0.6 = 0.4,  A = 0.4
    #   t=1: δ = 0 + 0.6 - 0.2 = 0.4, A = 0.4 + 0.5·0.4 = 0.6
    #   t=0: δ = 0 + 0.2 - 0.5 = -0.3, A = -0.3 + 0.5·0.6 = 0.0
    # Row 1 ends at t=1 (reward 1 there, garbage value 9 at the padding):
    #   t=1: δ = 1 + 0 - 0.2 = 0.8, A = 0.8;  t=0: δ = 0.2 - 0.5 = -0.3, A = -0.3 + 0.4 = 0.1
    rewards = jnp.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = jnp.array([[0.5, 0.2, 0.6], [0.5, 0.2, 9.0]])
    mask = jnp.array([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae(rewards=rewards, values=values, mask=mask, gamma=1.0, lam=0.5)
    np.testing.assert_allclose(adv, [[0.0, 0.6, 0.4], [0.1, 0.8, 0.0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0.5, 0.8, 1.0], [0.6, 1.0, 0.0]], atol=1e-6)


def _gae_loop(rewards, values, mask, gamma, lam):
    """Textbook GAE on the compressed sequence of valid positions of each row."""
    adv = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        idx = np.flatnonzero(mask[b])
        last = 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            next_v = values[b, idx[k + 1]] if k + 1 < len(idx) else 0.0
            last = rewards[b, t] + gamma * next_v - values[b, t] + gamma * lam * last
            adv[b, t] = last
    return adv


def test_gae_matches_python_loop():
    rng = np.random.default_rng(2)
    rewards = rng.normal(size=(5, 9)).astype(np.float32)
    values = rng.normal(size=(5, 9)).astype(np.float32)
    mask = rng.uniform(size=(5, 9)) < 0.7  # interior gaps too
    mask[0] = False  # an empty row
    for gamma, lam in ((1.0, 0.95), (0.9, 0.5)):
        adv, ret = gae(rewards=jnp.array(rewards), values=jnp.array(values),
                       mask=jnp.array(mask), gamma=gamma, lam=lam)
        want = _gae_loop(rewards, values, mask, gamma, lam)
        np.testing.assert_allclose(adv, want, atol=1e-5)
        np.testing.assert_allclose(ret, np.where(mask, want + values, 0.0), atol=1e-5)


def test_bad_inputs_name_the_culprit():
    with pytest.raises(ValueError, match="phi"):
        advantages.group_advantages(jnp.zeros(4), jnp.zeros(3), lam=0.5)
    with pytest.raises(ValueError, match="delta"):
        advantages.token_advantages(jnp.zeros(4), jnp.zeros(4), jnp.zeros((3, 2)), lam=0.5)
    with pytest.raises(ValueError, match="ddof"):
        advantages.group_advantages(jnp.zeros(4), jnp.zeros(4), lam=0.5, ddof=-1)
    with pytest.raises(ValueError, match="mask"):
        advantages.gae(rewards=jnp.zeros((2, 3)), values=jnp.zeros((2, 3)), mask=jnp.ones((2, 4)))


def test_ppo_advantages_by_hand():
    # Row 0: 2 valid tokens, r̃ = 1 at the last, V = [0.5, 0.2], γ = λ = 1:
    #   A_1 = 1 - 0.2 = 0.8, A_0 = (0.2 - 0.5) + 0.8 = 0.5; returns = A + V = [1, 1].
    # Row 1: no valid token (empty response): all zeros, no NaN.
    # Whitened over the 2 valid tokens: mean 0.65, std 0.15 -> [-1, 1].
    values = jnp.array([[0.5, 0.2, 9.0], [3.0, 3.0, 3.0]])
    mask = jnp.array([[1, 1, 0], [0, 0, 0]], bool)
    kw = dict(terminal_reward=jnp.array([1.0, -1.0]), values=values, mask=mask, gamma=1.0,
              lam=1.0, eps=0.0)
    adv, returns = advantages.ppo_advantages(whiten=False, **kw)
    np.testing.assert_allclose(adv, [[0.5, 0.8, 0.0], [0.0, 0.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(returns, [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], atol=1e-6)
    adv_w, returns_w = advantages.ppo_advantages(whiten=True, **kw)
    np.testing.assert_allclose(adv_w, [[-1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], atol=1e-5)
    np.testing.assert_allclose(returns_w, returns)  # the value targets are not whitened


@pytest.mark.parametrize("ddof", [0, 1])
def test_valid_mask_equals_the_smaller_group(ddof):
    """A group padded with invalid members (corrections, DESIGN §6) gets the advantages of the
    group of its valid members alone, and 0 on the padding, whatever the padding holds."""
    valid = jnp.array([True, False, True, True, False, True])
    rewards = jnp.array([1.0, 7.0, -1.0, -1.0, -3.0, 1.0])
    phi = jnp.array([0.0, 9.0, 0.5, 0.2, 1.0, 0.0])
    got = group_adv(rewards, phi, lam=0.5, ddof=ddof, eps=1e-6, valid=valid)
    std = math.sqrt(SUM_SQ / (4 - ddof))
    np.testing.assert_allclose(got[np.array(valid)], DEV / (std + 1e-6), rtol=1e-6)
    np.testing.assert_array_equal(got[~np.array(valid)], 0.0)
    delta = jnp.broadcast_to(phi[:, None], (6, 3))
    tok = token_adv(rewards, phi, delta, lam=0.5, ddof=ddof, eps=1e-6, valid=valid)
    np.testing.assert_allclose(tok, jnp.broadcast_to(got[:, None], (6, 3)), rtol=1e-6)


def test_valid_mask_degenerate_groups_are_zero_not_nan():
    """No valid member, one valid member, all valid members equal: exactly 0, no NaN."""
    rewards = jnp.array([[1.0, -1.0, 1.0], [1.0, -1.0, 1.0], [1.0, -1.0, 1.0]])
    valid = jnp.array([[False, False, False], [False, True, False], [True, False, True]])
    got = group_adv(rewards, jnp.zeros_like(rewards), lam=0.5, eps=0.0, valid=valid)
    np.testing.assert_array_equal(got, np.zeros((3, 3)))
