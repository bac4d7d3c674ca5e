"""Tests for ibpo_jax.core.comparison: the bit-parallel kernels against rapidfuzz, a greedy
subsequence reference (prefix rule) and a literal DP of DESIGN §2's LCS-alignment first error;
φ/Δ on hand-built groups and against a reference over small alphabets. Units, budgets, EOS and
token credit: tests/core/test_comparison_units.py."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import LCSseq, Levenshtein

from ibpo_jax.config.registry import OPERATORS, UnknownNameError
from ibpo_jax.core import _bitparallel
from ibpo_jax.core import comparison as C

PAD = 320  # static padded length of every kernel test input (11 words of 31 bits)
N_EXAMPLE = 8  # pairs drawn per hypothesis example
TILE = 8  # ... each repeated TILE times with different padding: 64 pairs

_lcs = jax.jit(jax.vmap(C.lcs_first_error))  # alignment="lcs", the default
_lcs_prefix = jax.jit(jax.vmap(functools.partial(C.lcs_first_error, alignment="prefix")))
_lev = jax.jit(jax.vmap(C.edit_distance))
_lcs1 = jax.jit(C.lcs_first_error, static_argnames="alignment")
# the public path splits 64 pairs into chunks of 32 (one 11-word stripe each); the unchunked
# kernels on 64 pairs use 2 stripes of 6 words, so the stripe hand-over is covered too
_lcs_stripes = jax.jit(_bitparallel._lcs_first_error_chunk)
_align_stripes = jax.jit(_bitparallel._lcs_alignment_chunk)
_lev_stripes = jax.jit(_bitparallel._levenshtein_chunk)
_lev1 = jax.jit(C.edit_distance)


def first_error_ref(a, b):
    """max k such that a[:k] is a subsequence of b (greedy matching is optimal for this)."""
    j = 0
    for k, x in enumerate(a):
        while j < len(b) and b[j] != x:
            j += 1
        if j == len(b):
            return k
        j += 1
    return len(a)


def _lcs_rows(a, b):
    """F [len(a) + 1, len(b) + 1] with F[k, q] = LCS(a[:k], b[:q]) (rows are nondecreasing, so
    row k + 1 = running max of max(row k, row k shifted by one + match))."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    f = np.zeros((len(a) + 1, len(b) + 1), np.int64)
    for k, x in enumerate(a):
        cand = f[k].copy()
        cand[1:] = np.maximum(cand[1:], f[k, :-1] + (b == x))
        f[k + 1] = np.maximum.accumulate(cand)
    return f


def alignment_ref(a, b):
    """(L, e) by DESIGN §2's definition, literally: e = max{k : ∃q, LCS(a[:k], b[:q]) = k and
    k + LCS(a[k:], b[q:]) = L}, over every (k, q), with the full forward and backward tables."""
    fwd = _lcs_rows(a, b)  # fwd[k, q] = LCS(a[:k], b[:q])
    bwd = _lcs_rows(a[::-1], b[::-1])[::-1, ::-1]  # bwd[k, q] = LCS(a[k:], b[q:])
    n, m = len(a), len(b)
    lcs = int(fwd[n, m])
    k = np.arange(n + 1)[:, None]
    ok = (fwd == k) & (k + bwd == lcs)
    return lcs, int(np.max(np.nonzero(ok.any(axis=1))[0]))


# word boundaries of the 31-bit words (and of 32/64-bit ones for good measure)
_EDGES = [0, 1, 2, 30, 31, 32, 33, 61, 62, 63, 64, 65, 92, 93, 94, 299, 300]
_length = st.one_of(st.sampled_from(_EDGES), st.integers(0, 300))


@st.composite
def _pair(draw):
    vocab = draw(st.sampled_from([1, 2, 3, 5, 40, 150_000]))
    sym = st.integers(0, vocab - 1)
    la, lb = draw(_length), draw(_length)
    a = draw(st.lists(sym, min_size=la, max_size=la))
    b = draw(st.lists(sym, min_size=lb, max_size=lb))
    return a, b


def _padded(seqs, rng):
    """[len(seqs), PAD] int32 with random garbage (including ids that occur in the data)."""
    out = rng.integers(-5, 150_000, size=(len(seqs), PAD)).astype(np.int32)
    for row, s in zip(out, seqs):
        row[: len(s)] = s
    return out


@settings(max_examples=120)
@given(pairs=st.lists(_pair(), min_size=N_EXAMPLE, max_size=N_EXAMPLE), seed=st.integers(0, 99))
def test_kernels_match_rapidfuzz(pairs, seed):
    rng = np.random.default_rng(seed)
    pairs = pairs * TILE
    a = _padded([p[0] for p in pairs], rng)
    b = _padded([p[1] for p in pairs], rng)
    la = np.array([len(p[0]) for p in pairs], np.int32)
    lb = np.array([len(p[1]) for p in pairs], np.int32)
    lcs, e = map(np.asarray, _lcs(a, b, la, lb))
    lcs_p, fe = map(np.asarray, _lcs_prefix(a, b, la, lb))
    lev = np.asarray(_lev(a, b, la, lb))
    for got, want in zip(_lcs_stripes(a, b, la, lb), (lcs_p, fe)):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(_align_stripes(a, b, la, lb), (lcs, e)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_lev_stripes(a, b, la, lb), lev)
    for i, (x, y) in enumerate(pairs[:N_EXAMPLE]):  # the TILE copies are checked equal below
        assert lcs[i] == lcs_p[i] == LCSseq.similarity(x, y), (i, len(x), len(y))
        assert lev[i] == Levenshtein.distance(x, y), (i, len(x), len(y))
        assert fe[i] == first_error_ref(x, y), (i, len(x), len(y))
        assert (lcs[i], e[i]) == alignment_ref(x, y), (i, x, y)
    for out in (lcs, e, fe, lev):  # same pairs with other padding garbage: same answers
        np.testing.assert_array_equal(out.reshape(TILE, N_EXAMPLE),
                                      np.tile(out[:N_EXAMPLE], (TILE, 1)))


def test_kernels_on_long_pairs_many_stripes():
    """64 pairs of ~1500 units: 49 words in 5 stripes, in 2 chunks of 32 pairs."""
    rng = np.random.default_rng(0)
    n, length = 64, 1500
    a = rng.integers(0, 30, size=(n, length)).astype(np.int32)
    b = np.where(rng.random((n, length)) < 0.7, a, rng.integers(0, 30, size=(n, length)))
    b = b.astype(np.int32)
    la = rng.integers(length - 100, length + 1, n).astype(np.int32)
    lb = rng.integers(0, length + 1, n).astype(np.int32)
    lb[:4] = [0, 1, 31, 62]
    lcs, e = map(np.asarray, _lcs(a, b, la, lb))
    fe = np.asarray(_lcs_prefix(a, b, la, lb)[1])
    lev = np.asarray(_lev(a, b, la, lb))
    for i in range(n):
        x, y = list(a[i, : la[i]]), list(b[i, : lb[i]])
        assert lcs[i] == LCSseq.similarity(x, y)
        assert lev[i] == Levenshtein.distance(x, y)
        assert fe[i] == first_error_ref(x, y)
        if i % 8 == 0:  # the O(n m) Python reference is slow at this length
            assert (lcs[i], e[i]) == alignment_ref(x, y)
    # a small batch takes the other stripe shape (32 words per stripe instead of 8)
    small = [x[:4] for x in (a, b, la, lb)]
    np.testing.assert_array_equal(jax.jit(jax.vmap(C.lcs_first_error))(*small)[0], lcs[:4])
    np.testing.assert_array_equal(jax.jit(jax.vmap(C.edit_distance))(*small), lev[:4])


@pytest.mark.parametrize("tiling, stripes", [
    (_bitparallel.ACCELERATOR_TILING, (9, 1)),  # one chunk of 48 pairs, one stripe of 9 words
    (dataclasses.replace(_bitparallel.ACCELERATOR_TILING, max_ks=2), (2, 5)),  # 5 stripes
    (dataclasses.replace(_bitparallel.CPU_TILING, chunk_pairs=7), (9, 1)),  # 7 chunks, 1 padded
], ids=["accelerator", "accelerator_narrow", "cpu_chunks_of_7"])
def test_tilings_change_the_work_not_the_answers(tiling, stripes):
    """Every tiling, traced on the test's backend, gives the answers of rapidfuzz and the
    references, and each traces its own program."""
    rng = np.random.default_rng(3)
    n, length = 48, 270
    a = rng.integers(0, 6, size=(n, length)).astype(np.int32)
    b = np.where(rng.random((n, length)) < 0.8, a, rng.integers(0, 6, size=(n, length)))
    b = b.astype(np.int32)
    la = rng.integers(0, length + 1, n).astype(np.int32)
    lb = rng.integers(0, length + 1, n).astype(np.int32)

    def state_shape(t):  # the [ks, P] state words of the program traced under tiling t
        ks, _ = _bitparallel._stripe_words(min(n, t.chunk_pairs), 9, t)
        return f"u32[{ks},{min(n, t.chunk_pairs)}]"

    def traced():
        return str(jax.make_jaxpr(jax.vmap(C.edit_distance))(a, b, la, lb))

    assert _bitparallel._stripe_words(min(n, tiling.chunk_pairs), 9, tiling) == stripes
    with _bitparallel.use_tiling(tiling):
        assert _bitparallel.current_tiling() == tiling
        assert state_shape(tiling) in traced()  # not a trace cached under another tiling
        lcs, e = map(np.asarray, jax.jit(jax.vmap(C.lcs_first_error))(a, b, la, lb))
        fe = np.asarray(jax.jit(jax.vmap(functools.partial(
            C.lcs_first_error, alignment="prefix")))(a, b, la, lb)[1])
        lev = np.asarray(jax.jit(jax.vmap(C.edit_distance))(a, b, la, lb))
    default = (_bitparallel.CPU_TILING if jax.default_backend() == "cpu"
               else _bitparallel.ACCELERATOR_TILING)
    assert _bitparallel.current_tiling() == default  # restored: the backend's
    assert state_shape(default) in traced()
    for i in range(n):
        x, y = list(a[i, : la[i]]), list(b[i, : lb[i]])
        assert lcs[i] == LCSseq.similarity(x, y)
        assert lev[i] == Levenshtein.distance(x, y)
        assert fe[i] == first_error_ref(x, y)
        if i % 6 == 0:
            assert (lcs[i], e[i]) == alignment_ref(x, y)


def test_pair_functions_unbatched_and_nested_vmap():
    a = jnp.array([1, 2, 3, 4, 7, 7], jnp.int32)
    b = jnp.array([1, 3, 2, 4, 9], jnp.int32)
    # a[:4] = 1 2 3 4 vs b[:4] = 1 3 2 4: LCS 3 (1 2 4 / 1 3 4); "1 2" is a subsequence, "1 2 3"
    # is not -> first error 2; two substitutions -> Levenshtein 2
    lcs, f = _lcs1(a, b, 4, 4)
    assert (int(lcs), int(f)) == (3, 2)
    assert int(_lev1(a, b, 4, 4)) == 2
    assert int(_lev1(a, b, 0, 3)) == 3 and int(_lev1(a, b, 5, 0)) == 5
    assert tuple(map(int, _lcs1(a, b, 0, 5))) == (0, 0)
    assert tuple(map(int, _lcs1(a, b, 99, -3))) == (0, 0)  # lengths are clipped to [0, L]
    # nested vmap with an unbatched argument folds into one kernel call and agrees
    aa = jnp.stack([a, a[::-1]])[None].repeat(3, 0)  # [3, 2, 6]
    lens = jnp.array([[4, 6], [2, 0], [6, 6]], jnp.int32)
    axes = (0, None, 0, None)
    got = jax.jit(jax.vmap(jax.vmap(C.edit_distance, axes), axes))(aa, b, lens, 5)
    want = [[Levenshtein.distance(list(map(int, aa[i, j, : lens[i, j]])), list(map(int, b)))
             for j in range(2)] for i in range(3)]
    np.testing.assert_array_equal(np.asarray(got), want)


def test_first_error_follows_the_optimal_alignment():
    """DESIGN §2's example: the leading 5 is in no optimal alignment (L = 4 = 1 2 3 4), so the
    first unmatched unit is unit 0; the v1 prefix rule matched "5" to b's last unit and says 1."""
    a = jnp.array([5, 1, 2, 3, 4], jnp.int32)
    b = jnp.array([1, 2, 3, 4, 5], jnp.int32)
    assert tuple(map(int, _lcs1(a, b, 5, 5))) == (4, 0)
    assert tuple(map(int, _lcs1(a, b, 5, 5, alignment="prefix"))) == (4, 1)
    assert alignment_ref([5, 1, 2, 3, 4], [1, 2, 3, 4, 5]) == (4, 0)
    # repeats: a = 1 2 1 2, b = 2 1 2: L = 3 only as a[1:] = 2 1 2; keeping a[0] (at b[1])
    # leaves LCS(2 1 2, 2) = 1 and 1 + 1 < 3, so e = 0; the prefix rule embeds "1 2" (f = 2)
    c, d = jnp.array([1, 2, 1, 2]), jnp.array([2, 1, 2])
    assert tuple(map(int, _lcs1(c, d, 4, 3))) == (3, 0)
    assert tuple(map(int, _lcs1(c, d, 4, 3, alignment="prefix"))) == (3, 2)
    assert alignment_ref([1, 2, 1, 2], [2, 1, 2]) == (3, 0)
    # a substitution after a right prefix: e = f = 3. The backward pass counts only from the
    # column of a[f] on (the first column it reads), so this pins where the counting starts.
    # In a batch it starts at the earliest such column of all pairs.
    s, t = jnp.array([1, 2, 3, 9, 4, 5]), jnp.array([1, 2, 3, 7, 4, 5])
    assert tuple(map(int, _lcs1(s, t, 6, 6))) == (5, 3)
    assert alignment_ref([1, 2, 3, 9, 4, 5], [1, 2, 3, 7, 4, 5]) == (5, 3)
    u = jnp.array([1, 2, 3, 9, 4, 0])  # f = 5: its count starts at the first column
    assert alignment_ref([1, 2, 3, 9, 4, 5], [1, 2, 3, 9, 4, 0]) == (5, 5)
    pair = jax.vmap(C.lcs_first_error)(jnp.stack([s, s]), jnp.stack([t, u]), jnp.array([6, 6]),
                                       jnp.array([6, 6]))
    assert np.asarray(pair).tolist() == [[5, 5], [3, 5]]
    # a fully embedded a: e = n under both rules
    assert tuple(map(int, _lcs1(jnp.array([1, 3]), jnp.array([1, 2, 3]), 2, 3))) == (2, 2)
    with pytest.raises(ValueError, match="ibpo.alignment"):
        C.lcs_first_error(a, b, 5, 5, alignment="greedy")


def test_bad_pair_input_raises():
    with pytest.raises(ValueError, match="a \\[La\\]"):
        C.lcs_first_error(jnp.zeros((2, 3), jnp.int32), jnp.zeros(3, jnp.int32), 1, 1)
    with pytest.raises(ValueError, match="integer"):
        C.edit_distance(jnp.zeros(3), jnp.zeros(3), 1, 1)


# ---------------------------------------------------------------------------------------------
# φ and Δ


def _phi(op):
    return jax.jit(lambda u, n, c: C.compute_phi(u, n, c, operator=op))


_PHI = {op: _phi(op) for op in ("terminal", "lcs", "lcs_first_error", "edit_distance")}
_SMALL_U = 12
_PHI_VARIANTS = {(op, al, red): jax.jit(functools.partial(C.compute_phi, operator=op,
                                                           alignment=al, reduce=red))
                 for op in ("lcs", "lcs_first_error", "edit_distance")
                 for al in ("lcs", "prefix") for red in ("max", "mean")}



# a hand-built group of 5 responses (unit ids), response 0 and 3 correct
_UNITS = np.array([[1, 2, 3, 4, 0],
                   [1, 2, 9, 4, 0],
                   [5, 1, 2, 3, 4],
                   [1, 2, 8, 4, 7],
                   [9, 9, 9, 0, 0]], np.int32)
_N = np.array([4, 4, 5, 5, 0], np.int32)
_CORRECT = np.array([True, False, False, True, False])


def test_phi_hand_built_group():
    # wrong 1 = [1 2 9 4] vs correct 0 = [1 2 3 4]: LCS 3, f 2, Lev 1 (max len 4)
    #                     vs correct 3 = [1 2 8 4 7]: LCS 3, f 2, Lev 2 (max len 5)
    # wrong 2 = [5 1 2 3 4] vs 0: LCS 4, f 0, Lev 1 (/5); vs 3: LCS 3, f 0, Lev 3 (/5)
    # wrong 4 is empty: phi 0
    lcs = _PHI["lcs"](_UNITS, _N, _CORRECT)
    np.testing.assert_allclose(lcs.phi, [0, 3 / 4, 4 / 5, 0, 0], rtol=1e-6)
    np.testing.assert_array_equal(lcs.best_match, [-1, 0, 0, -1, -1])  # tie on 1 -> lowest j
    fe = _PHI["lcs_first_error"](_UNITS, _N, _CORRECT)
    np.testing.assert_allclose(fe.phi, [0, 2 / 4, 0, 0, 0])
    np.testing.assert_array_equal(fe.first_error, [4, 2, 0, 5, 0])
    np.testing.assert_array_equal(fe.delta[1], [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(fe.delta[2], 0)
    ed = _PHI["edit_distance"](_UNITS, _N, _CORRECT)
    np.testing.assert_allclose(ed.phi, [0, 1 - 1 / 4, 1 - 1 / 5, 0, 0], rtol=1e-6)
    np.testing.assert_array_equal(ed.best_match, [-1, 0, 0, -1, -1])
    term = _PHI["terminal"](_UNITS, _N, _CORRECT)
    np.testing.assert_array_equal(term.phi, 0)
    np.testing.assert_array_equal(term.delta, 0)


@pytest.mark.parametrize("op", sorted(_PHI) + [v for v in _PHI_VARIANTS if v[1:] != ("lcs", "max")])
def test_phi_degenerate_groups(op):
    fn = _PHI[op] if isinstance(op, str) else _PHI_VARIANTS[op]
    for correct in (np.ones(5, bool), np.zeros(5, bool)):  # all correct / no correct response
        out = fn(_UNITS, _N, correct)
        np.testing.assert_array_equal(out.phi, 0)
        np.testing.assert_array_equal(out.delta, 0)
        np.testing.assert_array_equal(out.best_match, -1)
        assert np.isfinite(out.phi).all()
    out = fn(_UNITS, _N, np.zeros(5, bool))
    np.testing.assert_array_equal(out.first_error, 0)
    out = fn(_UNITS, _N, np.ones(5, bool))
    np.testing.assert_array_equal(out.first_error, _N)  # correct i reports n_i
    # every response empty
    out = fn(np.zeros((3, 4), np.int32), np.zeros(3, np.int32), np.array([True, False, False]))
    np.testing.assert_array_equal(out.phi, 0)
    assert np.isfinite(np.asarray(out.delta)).all()


def test_phi_ties_pick_lowest_correct_index():
    units = np.array([[1, 2, 0], [3, 4, 0], [1, 3, 0]], np.int32)
    n = np.array([2, 2, 2], np.int32)
    correct = np.array([True, True, False])  # wrong [1 3] shares one unit with each correct one
    for op in ("lcs", "edit_distance"):
        out = _PHI[op](units, n, correct)
        assert int(out.best_match[2]) == 0
    # lcs_first_error: f = 1 against 0 ([1]) and 0 against 1 -> j* = 0 either way
    assert int(_PHI["lcs_first_error"](units, n, correct).best_match[2]) == 0
    units[1] = [1, 4, 0]  # now f = 1 against both: tie, lowest j wins
    assert int(_PHI["lcs_first_error"](units, n, correct).best_match[2]) == 0


def _phi_reference(units, n, correct, op, alignment="lcs", reduce="max"):
    """(φ, j*, Δ) from rapidfuzz / the literal references, straight from the DESIGN §2 table."""
    g, u = units.shape
    phi, best, delta = np.zeros(g), np.full(g, -1), np.zeros((g, u))
    for i in range(g):
        if correct[i] or not correct.any() or n[i] == 0:
            continue
        x = list(units[i, : n[i]])
        scores, prefixes = [], []
        for j in np.nonzero(correct)[0]:
            y = list(units[j, : n[j]])
            e = alignment_ref(x, y)[1] if alignment == "lcs" else first_error_ref(x, y)
            prefixes.append(np.arange(u) < e)
            if op == "lcs":
                scores.append(LCSseq.similarity(x, y) / n[i])
            elif op == "lcs_first_error":
                scores.append(e / n[i])
            else:
                scores.append(1 - Levenshtein.distance(x, y) / max(n[i], n[j]))
        top = int(np.argmax(scores))  # first max = lowest j
        best[i] = np.nonzero(correct)[0][top]
        phi[i] = max(scores) if reduce == "max" else np.mean(scores)
        if op != "lcs_first_error":
            delta[i, : n[i]] = phi[i]
        elif phi[i] > 0:
            delta[i] = prefixes[top] if reduce == "max" else np.mean(prefixes, axis=0)
    return phi, best, delta


@st.composite
def _group(draw):
    """A group over a tiny alphabet (many ties and repeats), some responses empty."""
    g = draw(st.integers(2, 6))
    vocab = draw(st.integers(1, 3))
    n = draw(st.lists(st.integers(0, _SMALL_U), min_size=g, max_size=g))
    units = np.array(draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=_SMALL_U,
                                            max_size=_SMALL_U), min_size=g, max_size=g)), np.int32)
    correct = np.array(draw(st.lists(st.booleans(), min_size=g, max_size=g)))
    return units, np.array(n, np.int32), correct


@settings(max_examples=60, deadline=None)
@given(group=_group(), variant=st.sampled_from(sorted(_PHI_VARIANTS)))
def test_phi_matches_reference_small_alphabets(group, variant):
    units, n, correct = group
    out = _PHI_VARIANTS[variant](units, n, correct)
    phi, best, delta = _phi_reference(units, n, correct, *variant)
    np.testing.assert_allclose(out.phi, phi, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(out.best_match, best)
    np.testing.assert_allclose(out.delta, delta, rtol=1e-6, atol=1e-7)
    assert np.isfinite(np.asarray(out.phi)).all()


def test_reduce_mean_and_max_by_hand():
    """wrong [1 2 3 9] vs correct [1 2 3 4] (e = 3) and [1 7 7 7] (e = 1)."""
    units = np.array([[1, 2, 3, 9], [1, 2, 3, 4], [1, 7, 7, 7]], np.int32)
    n = np.array([4, 4, 4], np.int32)
    correct = np.array([False, True, True])
    top = _PHI_VARIANTS["lcs_first_error", "lcs", "max"](units, n, correct)
    mean = _PHI_VARIANTS["lcs_first_error", "lcs", "mean"](units, n, correct)
    np.testing.assert_allclose(top.phi, [0.75, 0, 0])
    np.testing.assert_allclose(top.delta[0], [1, 1, 1, 0])
    np.testing.assert_allclose(mean.phi, [0.5, 0, 0])  # (3/4 + 1/4) / 2
    np.testing.assert_allclose(mean.delta[0], [1, 0.5, 0.5, 0])
    assert int(top.best_match[0]) == int(mean.best_match[0]) == 1
    lcs_mean = _PHI_VARIANTS["lcs", "lcs", "mean"](units, n, correct)
    np.testing.assert_allclose(lcs_mean.phi, [0.5, 0, 0])  # LCS 3 and 1 of 4
    with pytest.raises(ValueError, match="ibpo.reduce"):
        C.compute_phi(units, n, correct, reduce="median")


@pytest.mark.parametrize("op", ["lcs", "lcs_first_error", "edit_distance"])
def test_phi_batch_matches_reference_and_single_group_calls(op):
    rng = np.random.default_rng(1)
    b, g, u = 6, 8, 40
    units = rng.integers(0, 4, size=(b, g, u)).astype(np.int32)
    n = rng.integers(0, u + 1, size=(b, g)).astype(np.int32)
    correct = rng.random((b, g)) < 0.4
    correct[0] = False  # a group without any correct response
    batched = jax.jit(jax.vmap(lambda x, m, c: C.compute_phi(x, m, c, operator=op)))(
        units, n, correct)
    for k in range(b):
        single = _PHI[op](units[k], n[k], correct[k])
        for field in C.Phi._fields:
            np.testing.assert_array_equal(getattr(batched, field)[k], getattr(single, field))
        phi_ref, best_ref, _ = _phi_reference(units[k], n[k], correct[k], op)
        np.testing.assert_allclose(batched.phi[k], phi_ref, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(batched.best_match[k], best_ref)
        # Δ is zero past n_i and its mean over the n_i units is φ_i
        delta = np.asarray(batched.delta[k])
        slots = np.arange(u)[None, :]
        assert (delta[slots >= n[k][:, None]] == 0).all()
        mean = delta.sum(1) / np.maximum(n[k], 1)
        np.testing.assert_allclose(mean, batched.phi[k], rtol=1e-5, atol=1e-6)


def test_phi_on_groups_sharded_over_devices():
    """A batch of groups sharded over the (8 fake CPU) devices gives the unsharded result."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    rng = np.random.default_rng(2)
    b = 2 * len(jax.devices())
    units = rng.integers(0, 3, size=(b, 4, 12)).astype(np.int32)
    n = rng.integers(0, 13, size=(b, 4)).astype(np.int32)
    correct = rng.random((b, 4)) < 0.5
    fn = jax.jit(jax.vmap(lambda x, m, c: C.compute_phi(x, m, c, operator="lcs_first_error")))
    want = fn(units, n, correct)
    got = fn(*(jax.device_put(x, shard) for x in (units, n, correct)))
    for field in C.Phi._fields:
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field))


def test_operator_registry_and_bad_group_input():
    assert {"terminal", "edit_distance", "lcs", "lcs_first_error"} <= set(OPERATORS.names())
    with pytest.raises(UnknownNameError, match="lcs_first_error"):
        C.compute_phi(_UNITS, _N, _CORRECT, operator="lcs_frist_error")
    with pytest.raises(ValueError, match="one group"):
        C.compute_phi(_UNITS[None], _N[None], _CORRECT[None])
    with pytest.raises(ValueError, match="n_units and correct"):
        C.compute_phi(_UNITS, _N[:3], _CORRECT)


def test_first_error_matrix_is_what_compute_phi_reads_for_its_peer():
    # Rows 0-1 right, 2-3 wrong; the example of DESIGN §2 in row 2 against row 0.
    units = jnp.array([[1, 2, 3, 4, 5], [1, 2, 9, 4, 5], [5, 1, 2, 3, 4], [1, 2, 3, 7, 5]])
    n = jnp.array([5, 5, 5, 5])
    correct = jnp.array([True, True, False, False])
    for alignment in ("lcs", "prefix"):
        e = C.first_error_matrix(units, n, alignment=alignment)
        out = C.compute_phi(units, n, correct, alignment=alignment)
        for i in (2, 3):
            assert int(out.first_error[i]) == int(e[i, int(out.best_match[i])])
    assert int(C.first_error_matrix(units, n, alignment="lcs")[2, 0]) == 0
    assert int(C.first_error_matrix(units, n, alignment="prefix")[2, 0]) == 1

