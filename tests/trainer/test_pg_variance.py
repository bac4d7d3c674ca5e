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
    # g_b = 2w / D with D = 6
    np.testing.assert_allclose(out["pg_mean_sqnorm"], 2 * (2 / 6) ** 2, rtol=1e-6)
    with pytest.raises(ValueError, match=">= 2 groups"):
        pg_variance.group_gradient_variance(terms, params, 1)


# ----------------------------------------------------------------- on the step's own loss

def _step_setup(algo, **overrides):
    from ibpo_jax import models
    from ibpo_jax.trainer import packing, step
    from ibpo_jax.trainer.state import init_state, make_optimizer
    from tests.trainer.test_step import (
        ARCH,
        GROUP0,
        GROUP1,
        IS_DELIM,
        REWARDS0,
        REWARDS1,
        _rollout,
        _spec,
    )

    cfg, spec = _spec(algo, **{"optim.minibatches": 1, **overrides})
    rollout = _rollout([*GROUP0, *GROUP1, *GROUP0], [*REWARDS0, *REWARDS1, *REWARDS0[::-1]])
    cred, _ = jax.jit(lambda r: step.credit(spec, r, IS_DELIM))(rollout)
    params = models.init(ARCH, jax.random.key(0), dtype=jnp.float32).params
    ref = jax.tree.map(lambda x: x * 0.9, params)  # a reference apart: the KL term counts
    state = init_state(params, make_optimizer(cfg.optim, total_updates=1))
    plan = packing.identity(np.asarray(rollout.prompt_len), 4, 4)
    return spec, state, ref, rollout, cred, plan


def test_per_group_gradients_of_the_run_loss_sum_to_its_batch_gradient():
    from ibpo_jax.trainer import step

    spec, state, ref, rollout, cred, plan = _step_setup("ibpo_gspo")
    batch, _ = step.prepare_batch(spec, state, ref, rollout, cred, plan)
    terms = lambda p, g: step.group_policy_terms(spec, p, batch, g)  # noqa: E731
    out = jax.jit(lambda p: pg_variance.group_gradient_variance(terms, p, 3))(state.params)
    rows = jnp.arange(12)[None, :]  # one micro-batch of every row: the update's gradient
    want, _, _ = step._gradients(spec, state.params, batch, rows)
    for a, b in zip(jax.tree.leaves(out["grad_sum"]), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7)
    assert float(out["pg_var"]) > 0


def test_measure_gives_ratio_one_without_phi_and_not_with_it():
    spec, state, ref, rollout, cred, plan = _step_setup("gspo")  # terminal: φ = 0
    out = jax.jit(lambda *a: pg_variance.measure(spec, *a))(state, ref, rollout, cred, plan)
    np.testing.assert_allclose(out["pg_var"], out["pg_var_gspo"], rtol=1e-6)
    np.testing.assert_allclose(out["pg_var_ratio"], 1.0, rtol=1e-6)
    spec, state, ref, rollout, cred, plan = _step_setup("ibpo_gspo")
    out = jax.jit(lambda *a: pg_variance.measure(spec, *a))(state, ref, rollout, cred, plan)
    assert abs(float(out["pg_var_ratio"]) - 1.0) > 1e-3
    assert all(np.isfinite(float(v)) for v in out.values())
