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


def _flat_grads(num, params, groups, den):
    return np.stack([np.concatenate([np.ravel(v) for v in jax.tree.leaves(
        jax.grad(num)(params, b))]) / den for b in groups])


def test_groups_that_do_not_count_are_skipped_not_taken_as_zero_gradients():
    params, terms, num, _, lengths = _problem(2)
    live = jnp.array([True, False, True, True, False])
    out = jax.jit(lambda p, v: pg_variance.group_gradient_variance(terms, p, B, v))(params, live)
    # The plain loop over groups 0, 2, 3 alone: their own normalizer, mean and B - 1 = 2.
    flat = _flat_grads(num, params, [0, 2, 3], float(jnp.sum(lengths[jnp.array([0, 2, 3])])))
    mean = flat.mean(0)
    np.testing.assert_allclose(out["pg_var"], ((flat - mean) ** 2).sum() / 2, rtol=1e-5)
    np.testing.assert_allclose(out["pg_mean_sqnorm"], (mean**2).sum(), rtol=1e-5)
    got = np.concatenate([np.ravel(v) for v in jax.tree.leaves(out["grad_sum"])])
    np.testing.assert_allclose(got, flat.sum(0), rtol=1e-5, atol=1e-7)
    # One group left: no spread (0, not 0 / 0); its gradient is the mean. None: all zeros.
    one = pg_variance.group_gradient_variance(terms, params, B, jnp.arange(B) == 3)
    g3 = _flat_grads(num, params, [3], float(lengths[3].sum()))[0]
    assert float(one["pg_var"]) == 0.0
    np.testing.assert_allclose(one["pg_mean_sqnorm"], (g3**2).sum(), rtol=1e-5)
    none = pg_variance.group_gradient_variance(terms, params, B, jnp.zeros(B, bool))
    assert float(none["pg_var"]) == float(none["pg_mean_sqnorm"]) == 0.0


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


def _measure(spec, *args):
    from tests.trainer.test_step import IS_DELIM

    return jax.jit(lambda *a: pg_variance.measure(spec, *a, IS_DELIM))(*args)


def test_measure_gives_ratio_one_without_phi_and_not_with_it():
    from ibpo_jax.trainer import credit as credit_lib

    spec, state, ref, rollout, cred, plan = _step_setup("gspo")  # terminal: φ = 0
    # measure() then takes the run's advantages for GSPO's (one measurement): they are.
    np.testing.assert_array_equal(
        cred.adv, credit_lib.group_advantages(spec, rollout, jnp.zeros_like(cred.phi)))
    out = _measure(spec, state, ref, rollout, cred, plan)
    np.testing.assert_allclose(out["pg_var"], out["pg_var_gspo"], rtol=1e-6)
    np.testing.assert_allclose(out["pg_var_ratio"], 1.0, rtol=1e-6)
    assert "grad_share_before_error" not in out  # no first errors without a comparison
    spec, state, ref, rollout, cred, plan = _step_setup("ibpo_gspo")
    out = _measure(spec, state, ref, rollout, cred, plan)
    assert abs(float(out["pg_var_ratio"]) - 1.0) > 1e-3
    assert all(np.isfinite(float(v)) for v in out.values())


@pytest.mark.parametrize("credit", ["sequence", "token"])
def test_token_parts_of_the_gradient_add_up_to_the_update_gradient(credit):
    """The before / after / other-token parts sum to the update's gradient (times its
    normalizer), and the shares measure logs are those parts' norms."""
    from ibpo_jax.trainer import credit as credit_lib
    from ibpo_jax.trainer import step
    from tests.trainer.test_step import IS_DELIM

    spec, state, ref, rollout, cred, plan = _step_setup("ibpo_gspo", **{"ibpo.credit": credit})
    batch, _ = step.prepare_batch(spec, state, ref, rollout, cred, plan)
    batch = step.with_advantages(spec, batch, cred)
    units = credit_lib.response_units(spec, rollout, IS_DELIM).token_unit
    before, after = credit_lib.error_sides(rollout, cred.first_error.reshape(-1), units, G)
    assert before.any() and after.any()  # the fixture's wrong responses have both sides
    rest = ~(before | after)
    terms = lambda p, k, t: step.group_policy_terms(spec, p, batch, k, through=t)[0]  # noqa
    parts = pg_variance.split_gradients(terms, state.params, jnp.arange(3)[:, None],
                                        (before, after, rest))
    rows = jnp.arange(12)[None, :]
    want, _, _ = step._gradients(spec, state.params, batch, rows)
    den = float(step.group_policy_terms(spec, state.params, batch, jnp.arange(3))[1])
    for *xs, w in zip(*(jax.tree.leaves(p) for p in parts), jax.tree.leaves(want)):
        np.testing.assert_allclose(sum(xs), w * den, rtol=2e-4, atol=1e-6)
    norm = lambda t: float(jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(t))))  # noqa
    out = _measure(spec, state, ref, rollout, cred, plan)
    share = norm(parts[0]) / (norm(parts[0]) + norm(parts[1]))
    np.testing.assert_allclose(out["grad_share_before_error"], share, rtol=1e-4)
    assert 0 < share < 1


def test_measure_leaves_dynamic_sampling_fillers_out():
    """A batch whose middle group is a filler (invalid rows, as dynamic sampling leaves when
    short of mixed groups) measures what the batch of its two valid groups alone does: the
    filler is neither a zero gradient in the spread nor a third group in B - 1."""
    from ibpo_jax.trainer import packing, step
    from tests.trainer.test_step import GROUP0, GROUP1, IS_DELIM, REWARDS0, REWARDS1, _rollout

    spec, state, ref, _, _, plan = _step_setup("ibpo_gspo")
    mixed = (1.0, -1.0, -1.0, -1.0)  # group 1's responses, one scored right
    # The filler in the middle: an all-wrong group, as dynamic sampling fills with.
    filled = _rollout([*GROUP0, *GROUP1, *GROUP1], [*REWARDS0, *REWARDS1, *mixed])._replace(
        valid=jnp.arange(12) // G != 1)
    cred = jax.jit(lambda r: step.credit(spec, r, IS_DELIM)[0])(filled)
    got = _measure(spec, state, ref, filled, cred, plan)
    alone = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *mixed])
    cred = jax.jit(lambda r: step.credit(spec, r, IS_DELIM)[0])(alone)
    want = _measure(spec, state, ref, alone, cred,
                    packing.identity(np.asarray(alone.prompt_len), 4, 4))
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, err_msg=k)
    assert float(want["pg_var"]) > 0 and float(want["pg_var_ratio"]) != 1.0
