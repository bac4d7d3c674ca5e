"""Where a batch's credit lands (issue 16's diagnostics), against numbers worked by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax.trainer import credit


def _rollout(correct, lengths, width=4):
    n = len(correct)
    z = jnp.zeros((n, width), jnp.int32)
    return credit.Rollout(prompt=z, prompt_len=jnp.ones(n, jnp.int32), response=z,
                          response_len=jnp.asarray(lengths, jnp.int32),
                          sample_logp=jnp.zeros((n, width)), reward=jnp.zeros(n),
                          correct=jnp.asarray(correct), ended=jnp.ones(n, bool))


def test_where_credit_goes_by_hand():
    # One group: row 0 right, row 1 wrong with two units (tokens 0-1 and 2-3), its first
    # error at unit 1: tokens 0-1 come before it, 2-3 after.
    r = _rollout([True, False], [4, 4])
    adv = jnp.array([[0.7] * 4, [0.5, 0.5, -1.0, -1.0]])  # token credit
    seq = jnp.array([0.7, -0.7])
    unit = jnp.array([[0, 0, 1, 1], [0, 0, 1, 1]])
    m = credit.where_credit_goes(r, adv, seq, jnp.array([2, 1]), unit, 2)
    assert float(m["adv_mass_before_error"]) == pytest.approx(1.0 / 3.0)
    assert float(m["adv_mean_before_error"]) == pytest.approx(0.5)
    assert float(m["adv_mean_after_error"]) == pytest.approx(-1.0)
    assert float(m["adv_sign_flip_frac"]) == pytest.approx(2 / 8)
    # Sequence credit: every token of a response has its advantage, nothing flips, and the
    # mass before the error is the token share (2 of 4).
    m = credit.where_credit_goes(r, seq, seq, jnp.array([2, 1]), unit, 2)
    assert float(m["adv_mass_before_error"]) == pytest.approx(0.5)
    assert float(m["adv_sign_flip_frac"]) == 0.0


def test_where_credit_goes_skips_unscored_rows_padding_and_units_of_none():
    # Group 0 all wrong (φ undefined: not scored); group 1: row 3 wrong, length 3, its EOS
    # (unit -1) belongs to neither side; a unit past the budget (-2) counts as after.
    r = _rollout([False, False, True, False], [4, 4, 4, 3])
    adv = jnp.array([-1.0, -1.0, 1.0, -1.0])
    unit = jnp.array([[0, 0, 1, 1]] * 3 + [[0, -2, -1, 0]])
    m = credit.where_credit_goes(r, adv, adv, jnp.array([0, 0, 2, 1]), unit, 2)
    assert float(m["adv_mass_before_error"]) == pytest.approx(0.5)  # token 0 vs token 1
    assert np.isfinite(float(m["adv_mean_after_error"]))
    # No scored row at all: 0, never NaN.
    r = _rollout([False, False], [4, 4])
    m = credit.where_credit_goes(r, adv[:2], adv[:2], jnp.array([0, 0]), unit[:2], 2)
    assert all(np.isfinite(float(v)) for v in m.values())
    assert float(m["adv_mass_before_error"]) == 0.0
