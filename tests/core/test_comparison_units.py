"""Tests for ibpo_jax.core.comparison's units: step splitting and hashing, unit budgets (the default
covers every unit, caps are flagged), EOS handling and the per-token credit `token_delta`."""

import jax
import numpy as np
import pytest

from ibpo_jax.core import comparison as C

_PHI = {"lcs_first_error": jax.jit(
    lambda u, n, c: C.compute_phi(u, n, c, operator="lcs_first_error"))}

# ---------------------------------------------------------------------------------------------
# Units

D = 10  # the delimiter token of the tests (e.g. "\n")
IS_DELIM = np.zeros(16, bool)
IS_DELIM[[D, 11]] = True  # two delimiter ids
_split = jax.jit(C.split_steps, static_argnames="max_units")
_index = jax.jit(C.token_unit_index, static_argnames="max_units")


def test_split_steps_structure():
    #              step0   |d| step1 |d  d| step2|  d | garbage past length
    toks = np.array([5, 6, D, 7, 11, D, 5, 6, D, 3, 3, 3], np.int32)
    units, n = _split(toks, 9, IS_DELIM)
    assert int(n) == 3 and units.shape == (6,)  # default budget (T + 1) // 2
    assert units[0] == units[2] and units[0] != units[1]  # "5 6" twice, at different offsets
    np.testing.assert_array_equal(units[3:], 0)
    np.testing.assert_array_equal(_index(toks, 9, IS_DELIM),
                                  [0, 0, 0, 1, 1, 1, 2, 2, 2, -1, -1, -1])
    # garbage after length and the padding values do not matter
    other = toks.copy()
    other[9:] = [D, 4, 4]
    np.testing.assert_array_equal(_split(other, 9, IS_DELIM)[0], units)
    # leading delimiters belong to no step; a trailing run closes the last step
    lead = np.array([D, D, 5, 6, D, D, 0, 0], np.int32)
    u2, n2 = _split(lead, 6, IS_DELIM)
    assert int(n2) == 1 and u2[0] == units[0]
    np.testing.assert_array_equal(_index(lead, 6, IS_DELIM), [-1, -1, 0, 0, 0, 0, -1, -1])


def test_split_steps_edge_cases():
    toks = np.array([1, D, 2, D, 3, D, 4], np.int32)
    units, n = _split(toks, 0, IS_DELIM)  # length 0
    assert int(n) == 0 and not np.asarray(units).any()
    np.testing.assert_array_equal(_index(toks, 0, IS_DELIM), -1)
    units, n = _split(np.full(5, D, np.int32), 5, IS_DELIM)  # delimiters only
    assert int(n) == 0
    # max_units truncation drops later steps and their tokens
    units, n = _split(toks, 7, IS_DELIM, max_units=2)
    full, n_full = _split(toks, 7, IS_DELIM)
    assert units.shape == (2,) and int(n) == 2 and int(n_full) == 4
    np.testing.assert_array_equal(units, full[:2])
    np.testing.assert_array_equal(_index(toks, 7, IS_DELIM, max_units=2), [0, 0, 1, 1, -2, -2, -2])
    with pytest.raises(ValueError, match="max_units"):
        C.split_steps(toks, 7, IS_DELIM, max_units=0)


def test_step_hash_distinguishes_steps():
    steps = [[5], [6], [5, 6], [6, 5], [5, 5], [5, 6, 6], [5, 6, 5], [0], [15], [12, 13, 14]]
    toks = []
    for s in steps:
        toks += s + [D]
    units, n = _split(np.array(toks, np.int32), len(toks), IS_DELIM)
    assert int(n) == len(steps)
    assert len(set(np.asarray(units[: len(steps)]).tolist())) == len(steps)


def test_units_batched_and_units_to_tokens():
    toks = np.array([[5, D, 6, 7, D, 0], [D, 6, 7, D, 5, 5]], np.int32)
    lens = np.array([5, 6], np.int32)
    split = jax.jit(jax.vmap(lambda t, m: C.split_steps(t, m, IS_DELIM, max_units=3)))
    units, n = split(toks, lens)
    np.testing.assert_array_equal(n, [2, 2])
    assert units[0, 1] == units[1, 0]  # "6 7" in both responses
    idx = jax.jit(jax.vmap(lambda t, m: C.token_unit_index(t, m, IS_DELIM, max_units=3)))(
        toks, lens)
    np.testing.assert_array_equal(idx, [[0, 0, 1, 1, 1, -1], [-1, 0, 0, 0, 1, 1]])
    delta = np.array([[0.5, 0.25, 9.0], [1.0, 2.0, 9.0]], np.float32)
    per_token = jax.jit(C.units_to_tokens)(delta, idx)
    np.testing.assert_array_equal(per_token, [[0.5, 0.5, 0.25, 0.25, 0.25, 0.0],
                                              [0.0, 1.0, 1.0, 1.0, 2.0, 2.0]])
    tu, tn = jax.jit(jax.vmap(C.token_units))(toks, lens)
    np.testing.assert_array_equal(tu, [[5, D, 6, 7, D, 0], [D, 6, 7, D, 5, 5]])
    np.testing.assert_array_equal(tn, lens)


def test_token_granularity_end_to_end():
    """Token units through compute_phi: wrong [1 2 3 9] vs correct [1 2 3 4]: f = 3 of 4."""
    toks = np.array([[1, 2, 3, 4, 0], [1, 2, 3, 9, 8]], np.int32)
    units, n = jax.vmap(C.token_units)(toks, np.array([4, 4]))
    out = _PHI["lcs_first_error"](units, n, np.array([True, False]))
    np.testing.assert_allclose(out.phi, [0, 0.75])
    np.testing.assert_array_equal(out.delta[1], [1, 1, 1, 0, 0])


# ---------------------------------------------------------------------------------------------
# Unit budget, EOS and token credit

EOS = 15
_resp_units = jax.jit(C.response_units, static_argnames=("granularity", "max_units"))


def _steps(*steps, tail=()):
    """Token row of the given steps, each closed by a delimiter, then `tail` tokens."""
    return [t for s in steps for t in (*s, D)] + list(tail)


def _phi_of(rows, ended, correct, granularity="step", max_units=None):
    width = max(map(len, rows))
    toks = np.array([r + [0] * (width - len(r)) for r in rows], np.int32)
    lens = np.array([len(r) for r in rows], np.int32)
    u = _resp_units(toks, lens, np.asarray(ended), IS_DELIM, granularity=granularity,
                    max_units=max_units)
    return u, _PHI["lcs_first_error"](u.units, u.n_units, np.asarray(correct))


def test_default_budget_covers_every_unit_and_caps_are_flagged():
    """A wrong response whose first 4 of 5 steps are right: φ = 4/5 at every budget that holds
    its 5 steps (a cap must not change it); a cap of 2 covers 2 of them and is flagged."""
    right = _steps([1], [2], [3], [4], [5], [6])
    wrong = _steps([1], [2], [3], [4], [9])
    rows = [right, wrong]
    for budget in (None, 5, 8):
        u, out = _phi_of(rows, [False, False], [True, False], max_units=budget)
        np.testing.assert_allclose(out.phi, [0, 0.8])
        np.testing.assert_array_equal(u.truncated, [budget == 5, False])  # right has 6 steps
        np.testing.assert_array_equal(out.delta[1, :5], [1, 1, 1, 1, 0])
    assert _resp_units(np.array([rows[0]], np.int32), np.array([12]), np.array([False]),
                       IS_DELIM).units.shape == (1, 6)  # (T + 1) // 2 slots
    u, out = _phi_of(rows, [False, False], [True, False], max_units=2)
    np.testing.assert_array_equal(u.truncated, [True, True])
    np.testing.assert_array_equal(u.n_units, [2, 2])
    np.testing.assert_allclose(out.phi, [0, 1.0])  # the uncovered tail is out of φ's denominator
    np.testing.assert_array_equal(u.token_unit[1], [0, 0, 1, 1] + [-2] * 6 + [-1] * 2)
    # worst case for steps: one-token steps between single delimiters, T odd and even
    for width in (1, 2, 7, 8):
        toks = np.array([[1 + (t % 3) if t % 2 == 0 else D for t in range(width)]], np.int32)
        uw = _resp_units(toks, np.array([width]), np.array([False]), IS_DELIM)
        assert int(uw.n_units[0]) == (width + 1) // 2 and not bool(uw.truncated[0])
    # token granularity: the budget defaults to the response width
    tok = _resp_units(np.array([wrong], np.int32), np.array([10]), np.array([False]), None,
                      granularity="token")
    assert tok.units.shape == (1, 10) and int(tok.n_units[0]) == 10
    cap = _resp_units(np.array([wrong], np.int32), np.array([10]), np.array([True]), None,
                      granularity="token", max_units=4)
    assert int(cap.n_units[0]) == 4 and bool(cap.truncated[0])
    np.testing.assert_array_equal(cap.token_unit[0], [0, 1, 2, 3, -2, -2, -2, -2, -2, -1])


def test_comparison_ignores_eos_only_on_ended_rows():
    """ended=True: the last token (EOS) is out of the units, whatever it is; ended=False (the
    row ran out of tokens): every token counts, so its last unit can be an error."""
    right = _steps([1], [2], [3])
    wrong = _steps([1], [2]) + [7]  # a third step "7" with no closing delimiter
    for granularity in ("step", "token"):
        ended, _ = _phi_of([right + [EOS], wrong + [EOS]], [True, True], [True, False],
                           granularity)
        plain, _ = _phi_of([right, wrong], [False, False], [True, False], granularity)
        np.testing.assert_array_equal(ended.n_units, plain.n_units)
        for a, b, n in zip(ended.units, plain.units, plain.n_units):
            np.testing.assert_array_equal(np.asarray(a)[:n], np.asarray(b)[:n])
        assert (np.asarray(ended.token_unit)[:, -1] == -1).all()  # EOS has no unit
    _, out = _phi_of([right, wrong], [False, False], [True, False])
    np.testing.assert_allclose(out.phi, [0, 2 / 3])  # "7" (kept: not an EOS) is the error
    _, out = _phi_of([right, wrong], [False, True], [True, False])
    np.testing.assert_allclose(out.phi, [0, 1.0])  # had it been EOS, nothing is wrong
    with pytest.raises(ValueError, match="ibpo.granularity"):
        C.response_units(np.zeros((1, 3), np.int32), [3], [False], IS_DELIM, granularity="word")


def test_token_delta_keeps_phi_as_the_token_mean():
    """Steps of 3, 1 and 4 tokens (+ delimiters) and EOS, first error at step 2: φ = 2/3, the
    unit indicators [1 1 0] cover 4 + 2 = 6 of the 11 loss tokens, so each is scaled by
    (2/3) * 11 / 6; their token mean is φ, and their relative weights are kept."""
    row = _steps([1, 1, 1], [2], [3, 3, 3, 3]) + [EOS]
    assert len(row) == 12
    u = _resp_units(np.array([row], np.int32), np.array([12]), np.array([True]), IS_DELIM)
    delta_units = np.zeros((1, u.units.shape[1]), np.float32)
    delta_units[0, :2] = 1
    phi = np.array([2 / 3], np.float32)
    got = np.asarray(jax.jit(C.token_delta)(delta_units, phi, u.token_unit, np.array([12])))
    scale = (2 / 3) * 12 / 6
    np.testing.assert_allclose(got[0], [scale] * 6 + [0] * 6, rtol=1e-6)
    np.testing.assert_allclose(got[0].mean(), 2 / 3, rtol=1e-6)
    # uncovered tail tokens get φ itself; the covered part keeps the token mean at φ
    cap = _resp_units(np.array([row], np.int32), np.array([12]), np.array([True]), IS_DELIM,
                      max_units=2)
    got = np.asarray(C.token_delta(np.array([[1.0, 0.0]]), phi, cap.token_unit, np.array([12])))
    np.testing.assert_allclose(got[0, 6:11], 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(got[0].mean(), 2 / 3, rtol=1e-6)
    assert got[0, 11] == 0  # EOS
    # φ = 0, or no loss tokens: all zero, never NaN
    zero = C.token_delta(np.zeros((2, 6)), np.zeros(2), u.token_unit.repeat(2, 0),
                         np.array([12, 0]))
    np.testing.assert_array_equal(zero, 0)
