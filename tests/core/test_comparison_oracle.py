"""Issue 57's operators on hand-built groups: `checker` (φ from the checker's first wrong step),
`peer_steps` (the first unit no correct peer took) and `vouched_steps` (the later of that and
the completions' vouched count), against values worked by hand and against `lcs_first_error`
where they must agree."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax.core import comparison as C

# Group of 5: 0 and 3 right; 1 wrong, its 3rd unit (9) is no peer's; 2 wrong, the peers'
# units in another order, then 6 (no peer's); 4 empty.
UNITS = np.array([[1, 2, 3, 4, 0],
                  [1, 2, 9, 4, 0],
                  [4, 3, 1, 6, 2],
                  [1, 2, 8, 4, 7],
                  [0, 0, 0, 0, 0]], np.int32)
N = np.array([4, 4, 5, 5, 0], np.int32)
CORRECT = np.array([True, False, False, True, False])


@jax.jit
def _checker(units, n, correct, truth):
    return C.compute_phi(units, n, correct, operator="checker", truth=truth)


@jax.jit
def _peer(units, n, correct):
    return C.compute_phi(units, n, correct, operator="peer_steps")


def test_checker_phi_delta_first_error_by_hand():
    # The checker: row 1 first wrong at unit 2, row 2 at unit 0, row 4 (empty) at 0.
    out = _checker(UNITS, N, CORRECT, np.array([-1, 2, 0, -1, 0], np.int32))
    np.testing.assert_allclose(out.phi, [0, 2 / 4, 0, 0, 0])
    np.testing.assert_array_equal(out.first_error, [4, 2, 0, 5, 0])
    np.testing.assert_array_equal(out.delta[1], [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(out.delta[2], 0)
    np.testing.assert_array_equal(out.best_match, -1)
    # No wrong step named (every line present is right, e.g. cut short): e = n, φ = 1, capped
    # there like lcs_first_error's prefix of a correct peer; a truth past n is capped too.
    out = _checker(UNITS, N, CORRECT, np.array([-1, -1, 9, -1, -1], np.int32))
    np.testing.assert_allclose(out.phi, [0, 1, 1, 0, 0])
    np.testing.assert_array_equal(out.first_error, [4, 4, 5, 5, 0])


def test_checker_equals_lcs_first_error_given_its_first_errors():
    """Given lcs_first_error's own first errors as the truth, the checker reproduces its φ,
    Δ and first errors: the two normalize, cap and credit alike (issue 57)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        units = rng.integers(1, 4, (6, 7)).astype(np.int32)
        n = rng.integers(0, 8, 6).astype(np.int32)
        correct = rng.random(6) < 0.4
        ref = C.compute_phi(units, n, correct, operator="lcs_first_error")
        out = _checker(units, n, correct, np.asarray(ref.first_error))
        np.testing.assert_allclose(out.phi, ref.phi, rtol=1e-6)
        np.testing.assert_array_equal(out.delta, ref.delta)
        np.testing.assert_array_equal(out.first_error, ref.first_error)


def test_checker_needs_its_truth():
    with pytest.raises(ValueError, match="checker"):
        C.compute_phi(UNITS, N, CORRECT, operator="checker")


def test_peer_steps_by_hand_order_free():
    out = _peer(UNITS, N, CORRECT)
    # row 1: 1, 2 taken by a peer, 9 by none -> e 2; row 2: 4 3 1 all taken (another order,
    # which LCS would cut at 1 or 2), 6 by none -> e 3.
    np.testing.assert_array_equal(out.first_error, [4, 2, 3, 5, 0])
    np.testing.assert_allclose(out.phi, [0, 2 / 4, 3 / 5, 0, 0])
    np.testing.assert_array_equal(out.delta[2], [1, 1, 1, 0, 0])
    lcs = C.compute_phi(UNITS, N, CORRECT, operator="lcs_first_error")
    assert int(lcs.first_error[2]) < 3


def test_peer_steps_reads_correct_peers_only_inside_their_lengths():
    units = np.array([[1, 2, 5, 0], [5, 3, 0, 0], [3, 7, 0, 0]], np.int32)
    # row 0 right but its 3rd unit (5) is padding (n 2); row 1 wrong; row 2 wrong holds 3
    out = _peer(units, np.array([2, 2, 2], np.int32), np.array([True, False, False]))
    np.testing.assert_array_equal(out.first_error, [2, 0, 0])  # 5 only past n, 3 a wrong one's
    # extreme ids (the sort's sentinel is int32 max) match like any other
    big = np.iinfo(np.int32).max
    units = np.array([[big, -big, 0], [big, -big, 4], [big, 1, 0]], np.int32)
    out = _peer(units, np.array([2, 3, 2], np.int32), np.array([True, False, False]))
    np.testing.assert_array_equal(out.first_error, [2, 2, 1])


@jax.jit
def _vouched(units, n, correct, vouched):
    return C.compute_phi(units, n, correct, operator="vouched_steps", vouched=vouched)


def test_vouched_steps_keeps_the_later_of_peers_and_completions():
    # row 1: peers vouch for 2 steps, a completion for 3 -> e 3; row 2: peers 3, completions 1
    # -> 3; row 3 is right and row 4 empty whatever the counts say; a count past n is capped.
    out = _vouched(UNITS, N, CORRECT, np.array([0, 3, 1, 2, 2], np.int32))
    np.testing.assert_array_equal(out.first_error, [4, 3, 3, 5, 0])
    np.testing.assert_allclose(out.phi, [0, 3 / 4, 3 / 5, 0, 0])
    np.testing.assert_array_equal(out.delta[1], [1, 1, 1, 0, 0])
    capped = _vouched(UNITS, N, CORRECT, np.array([0, 9, 0, 0, 0], np.int32))
    assert int(capped.first_error[1]) == 4 and float(capped.phi[1]) == 1.0
    # No completion vouches for anything: exactly peer_steps.
    none = _vouched(UNITS, N, CORRECT, np.zeros(5, np.int32))
    peer = _peer(UNITS, N, CORRECT)
    for field in ("phi", "delta", "first_error"):
        np.testing.assert_array_equal(getattr(none, field), getattr(peer, field))
    with pytest.raises(ValueError, match="vouched"):
        C.compute_phi(UNITS, N, CORRECT, operator="vouched_steps")


@pytest.mark.parametrize("op", ["checker", "peer_steps", "vouched_steps"])
def test_degenerate_groups_never_nan(op):
    kw = ({"truth": jnp.zeros(5, jnp.int32)} if op == "checker" else
          {"vouched": jnp.full(5, 3, jnp.int32)} if op == "vouched_steps" else {})
    for correct in (np.ones(5, bool), np.zeros(5, bool)):
        out = C.compute_phi(UNITS, N, correct, operator=op, **kw)
        np.testing.assert_array_equal(out.phi, 0)
        np.testing.assert_array_equal(out.delta, 0)
        np.testing.assert_array_equal(out.first_error, N if correct.all() else 0)


def test_vmapped_over_groups_equals_one_group_calls():
    rng = np.random.default_rng(1)
    units = rng.integers(0, 5, (3, 6, 8)).astype(np.int32)
    n = rng.integers(0, 9, (3, 6)).astype(np.int32)
    correct = rng.random((3, 6)) < 0.5
    truth = rng.integers(-1, 9, (3, 6)).astype(np.int32)
    peer = jax.vmap(_peer)(units, n, correct)
    check = jax.vmap(_checker)(units, n, correct, truth)
    for b in range(3):
        np.testing.assert_array_equal(peer.first_error[b], _peer(units[b], n[b], correct[b])
                                      .first_error)
        np.testing.assert_array_equal(check.phi[b], _checker(units[b], n[b], correct[b],
                                                             truth[b]).phi)
