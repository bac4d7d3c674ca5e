"""ibpo_jax/trainer/pg_variance.py against a plain loop over groups and the batch gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax.trainer import pg_variance

B, G, D = 5, 4, 3


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    params = {"w": jnp.array(rng.normal(size=(D,)), jnp.float32),
              "b": jnp.array(rng.normal(size=()), jnp.float32)}
    x = jnp.array(rng.normal(size=(B, G, D)), jnp.float32)
    adv = jnp.array(rng.normal(size=(B, G)), jnp.float32)
    lengths = jnp.array(rng.integers(1, 6, size=(B, G)), jnp.float32)  # token counts

    def num(p, b):  # a token-mean-style numerator: Σ_i A_i·len_i·logπ_i of group b
        logp = jax.nn.log_sigmoid(x[b] @ p["w"] + p["b"])
        return -jnp.sum(adv[b] * lengths[b] * logp)

    def terms(p, b):
        return num(p, b), jnp.sum(lengths[b])

    def batch_loss(p):
        return sum(num(p, b) for b in range(B)) / jnp.sum(lengths)

    return params, terms, num, batch_loss, lengths


def test_per_group_gradients_sum_to_the_batch_gradient():
    params, terms, _, batch_loss, _ = _problem()
    out = jax.jit(lambda p: pg_variance.group_gradient_variance(terms, p, B))(params)
    want = jax.grad(batch_loss)(params)
    for k in params:
        np.testing.assert_allclose(out["grad_sum"][k], want[k], rtol=1e-5, atol=1e-6)


def test_variance_equals_a_plain_loop_over_groups():
    params, terms, num, _, lengths = _problem(1)
    out = pg_variance.group_gradient_variance(terms, params, B)
    den = float(jnp.sum(lengths))
    flat = [np.concatenate([np.ravel(v) for v in jax.tree.leaves(jax.grad(num)(params, b))]) / den
            for b in range(B)]
    flat = np.stack(flat)
    mean = flat.mean(0)
    np.testing.assert_allclose(out["pg_var"], ((flat - mean) ** 2).sum() / (B - 1), rtol=1e-5)
    np.testing.assert_allclose(out["pg_mean_sqnorm"], (mean**2).sum(), rtol=1e-5)
    assert float(out["pg_var"]) > 0


def test_identical_groups_have_zero_variance_and_one_group_is_refused():
    params = {"w": jnp.ones(2)}
    terms = lambda p, b: (jnp.sum(p["w"] ** 2), jnp.float32(2.0))  # noqa: E731 same every group
    out = pg_variance.group_gradient_variance(terms, params, 3)
    np.testing.assert_allclose(out["pg_var"], 0.0, atol=1e-7)
    np.testing.assert_allclose(out["pg_mean_sqnorm"], 2 * (2 / 6) ** 2, rtol=1e-6)  # g_b = 2w / D, D = 6
    with pytest.raises(ValueError, match=">= 2 groups"):
        pg_variance.group_gradient_variance(terms, params, 1)
