"""Bit-parallel LCS and Levenshtein kernels over batches of int32 sequence pairs (DESIGN §2).

Three batch kernels: `lcs_first_error_batch` (LCS and the v1 prefix rule's first error),
`lcs_alignment_batch` (LCS and the first unit left unmatched by an optimal alignment: one
backward LCS pass that also counts, per text column it needs, the state bits under a
per-column budget)
and `levenshtein_batch`.

The kernels compare a *pattern* `a` (bit k of the state stands for a[k]) with a *text* `b`
scanned column by column: Allison-Dix / Hyyrö (2004) for LCS, Myers (1999) / Hyyrö (2003) for
Levenshtein. Everything is plain uint32 arithmetic in `lax.scan`, batched over all pairs.

Layout
- Words carry 31 payload bits; bit 31 holds the carry (LCS) or the horizontal delta (Levenshtein)
  that the word hands to the word above it. Pattern position i lives in word i // 31, bit i % 31.
- Stripes: the words are processed `ks` at a time (a stripe). Inside a stripe, word k handles
  column s - k at scan step s (a skewed wavefront), so the carry it needs from word k - 1 was
  produced one step earlier and sits in that word's bit 31: every step is a handful of
  elementwise ops on a [ks, P] array, with no carry resolution. The stripe's top word hands its
  per-column carries to the next stripe through a [columns, P] array.
- Match masks: no table over the vocabulary. Symbols get a per-pair rank (index of the first
  occurrence in the sorted pattern; one searchsorted for pattern and text); per stripe an int16
  map rank -> local id and a [P, 31 ks + 1, ks] table of match words (row 0 = "no match") are
  built by scatter, and each step gathers its [ks, P] words from that table. `ks` is chosen from
  the number of pairs so that a step stays within the tiling's `target_width` lanes and the
  table within its `table_words`. On CPUs both are small (wider steps get split across threads
  by XLA, whose per-step synchronisation costs more than it saves; a table must stay in L2: 1 MB
  tables made the loop 4x slower); on GPUs and TPUs a step costs about one launch whatever its
  width, so both are as large as memory allows (`Tiling`, chosen by backend, in `core/_tiling.py`).
- Batches larger than the tiling's `chunk_pairs` run chunk by chunk (`lax.map`), so every size
  above keeps its single-chunk value and the cost stays linear in the number of pairs.
- Every batch kernel takes `tiling=` (default `current_tiling()`: the backend's, or the one
  `use_tiling` sets); it changes the work, never the answers.

Padding beyond a_len / b_len may hold anything: pattern positions >= a_len get no match bits
(and rows above a_len never influence rows below them anyway), text columns >= b_len get
"no match" (an identity update for LCS, masked explicitly for Levenshtein).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from ibpo_jax.core._tiling import (  # noqa: F401  (re-exported: the kernels' tiling API)
    ACCELERATOR_TILING,
    CPU_TILING,
    Tiling,
    current_tiling,
    use_tiling,
)

_BITS = 31  # payload bits per uint32 word; bit 31 carries between words
_M31 = 0x7FFFFFFF
_TOP = 0x80000000


# columns per window of the greedy embedding's scan (one gather of a's symbols per window)
_GREEDY_BLOCK = 16


def _stripe_words(n_pairs: int, n_words: int, t: Tiling) -> tuple[int, int]:
    """(ks, n_stripes): words per stripe and stripe count for this batch (static)."""
    n_pairs = max(n_pairs, 1)
    ks_cache = math.isqrt(t.table_words // (_BITS * n_pairs))
    ks = max(1, min(t.max_ks, t.target_width // n_pairs, ks_cache, n_words))
    n_stripes = -(-n_words // ks)
    ks = -(-n_words // n_stripes)  # balance so the last stripe is not mostly padding
    return ks, n_stripes


def _ranks(a, b, a_len, b_len, pad):
    """Per-pair symbol ranks: ra [P, La] and rb [Lb + 2 pad, P] (transposed, `pad` "no match"
    rows on both sides) int32, from a [P, La], b [P, Lb].

    rank = index of the value's first occurrence in the sorted pattern, so equal symbols get
    equal ranks; La means "no match" (pattern padding, text padding, text symbols not in a).
    """
    n_a, n_b = a.shape[1], b.shape[1]
    sa = jnp.sort(a, axis=1)  # padding included: ranks stay consistent, the map ignores it
    both = jnp.concatenate([a, b], axis=1)  # one search for pattern and text
    idx = jax.vmap(lambda s, x: jnp.searchsorted(s, x, side="left", method="scan_unrolled"))(
        sa, both)
    ra = jnp.where(jnp.arange(n_a)[None, :] < a_len[:, None], idx[:, :n_a], n_a)
    ib = idx[:, n_a:]
    hit = jnp.take_along_axis(sa, jnp.minimum(ib, n_a - 1), axis=1) == b
    hit &= jnp.arange(n_b)[None, :] < b_len[:, None]
    rb = jnp.pad(jnp.where(hit, ib, n_a).T, ((pad, pad), (0, 0)), constant_values=n_a)
    return ra, rb


def _stripe_setup(ra, rb, q, ks):
    """Match table and text ids of stripe q.

    Returns table [P, 31 ks + 1, ks] uint32 (row r, word k: bits of the stripe positions whose
    symbol has local id r; row 0 is all zeros) and ids [rows of rb, P] int32, the local id of
    each (padded) text column.
    """
    n_pairs, n_a = ra.shape
    width = _BITS * ks
    rows = width + 1
    pp = jnp.arange(n_pairs)[:, None]
    loc = jnp.arange(width)
    seg = lax.dynamic_slice_in_dim(ra, q * width, width, axis=1)  # [P, 31 ks]
    valid = seg < n_a
    # local id = 1 + position of the symbol's last occurrence in the stripe (any consistent
    # choice works); rank n_a ("none") and out-of-range scatters are dropped.
    id_map = jnp.zeros((n_pairs, n_a + 1), jnp.int16).at[pp, jnp.where(valid, seg, n_a + 1)].max(
        (loc[None, :] + 1).astype(jnp.int16), mode="drop")
    lid = jnp.take_along_axis(id_map, jnp.minimum(seg, n_a), axis=1).astype(jnp.int32)
    bits = jnp.left_shift(jnp.uint32(1), (loc % _BITS).astype(jnp.uint32))
    table = jnp.zeros((n_pairs, rows, ks), jnp.uint32).at[
        pp, jnp.where(valid, lid, rows), (loc // _BITS)[None, :]].add(bits[None, :], mode="drop")
    ids = id_map[jnp.arange(n_pairs)[None, :], rb].astype(jnp.int32)
    return table, ids


def _padded_pattern_ranks(ra, n_words):
    n_a = ra.shape[1]
    return jnp.pad(ra, ((0, 0), (0, n_words * _BITS - n_a)), constant_values=n_a)


def _striped_inputs(a, b, a_len, b_len, tiling: Tiling | None):
    """Both kernels' set-up under `tiling` (None: `current_tiling()`): (pattern ranks padded to
    whole stripes, text ranks, words per stripe, stripes, scan steps = text length + the
    wavefront's skew)."""
    n_pairs, n_a = a.shape
    ks, n_stripes = _stripe_words(n_pairs, -(-n_a // _BITS), tiling or current_tiling())
    ra, rb = _ranks(a, b, a_len, b_len, ks - 1)
    return _padded_pattern_ranks(ra, n_stripes * ks), rb, ks, n_stripes, b.shape[1] + ks - 1


def _skewed_gather(table, ids_pad, s, ks):
    """Match words of step s: word k reads column s - k. -> [ks, P] uint32."""
    ids = lax.dynamic_slice_in_dim(ids_pad, s, ks, axis=0)[::-1]  # [ks, P]
    pp = jnp.arange(table.shape[0])[None, :]
    return table[pp, ids, jnp.arange(ks)[:, None]]


def _skewed_gather_flat(table, ids_pad, s, ks):
    """`_skewed_gather` through a flat index (same values, a distinct XLA expression)."""
    ids = lax.dynamic_slice_in_dim(ids_pad, s, ks, axis=0)[::-1]
    n_pairs, rows, _ = table.shape
    flat = (jnp.arange(n_pairs)[None, :] * rows + ids) * ks + jnp.arange(ks)[:, None]
    return table.reshape(-1)[flat]


def _myers(eq, pstate, mstate, hp, hn):
    """One Myers column update of [ks, P] words -> (Ph, Mh) shifted up by one with h_in in
    bit 0 and the h_out of each word in bit 31, and Xv."""
    pv = pstate & _M31
    mv = mstate & _M31
    xv = eq | mv
    eq = eq | hn  # "Eq |= 1 when h_in < 0" (hn is 0/1 in bit 0)
    xh = ((((eq & pv) + pv) ^ pv) | eq) & _M31
    ph = mv | (~(xh | pv) & _M31)
    mh = pv & xh
    return (ph << 1) | hp, (mh << 1) | hn, xv


def _shift_up(x, bottom):
    """x [ks, P] -> row k gets x[k - 1] (row 0 gets `bottom` [P]). Written as a zero-concat
    plus a masked OR: XLA vectorizes this, a concat with a dynamic row it does not."""
    ks = x.shape[0]
    up = jnp.concatenate([jnp.zeros_like(x[:1]), x[:-1]], axis=0)
    return up | jnp.where(jnp.arange(ks)[:, None] == 0, bottom[None, :], 0)


def _column_counts(x, r_pad, s, base, part, nin_s):
    """Masked popcounts of one step, carried up the stripe like the addition's carry.

    x [ks, P] new state words (word k at column s - k), r_pad [rows, P] per-column bit budget
    (skewed like the text ids), base [ks, 1] the first pattern bit of each word. Returns the
    new partial sums: row k = ones among the low r bits of words 0..k for column s - k, plus
    the count handed in from the stripes below (`nin_s` for row 0).
    """
    ks = x.shape[0]
    r = lax.dynamic_slice_in_dim(r_pad, s, ks, axis=0)[::-1]
    nbits = jnp.clip(r - base, 0, _BITS).astype(jnp.uint32)
    cnt = lax.population_count(x & (jnp.left_shift(jnp.uint32(1), nbits) - 1))
    return _shift_up(part, nin_s) + cnt


def lcs_words(a, b, a_len, b_len, col_bits=None, count_from=None, *,
              tiling: Tiling | None = None):
    """Final Hyyrö LCS state words. a [P, La], b [P, Lb] int32; a_len, b_len [P] int32.

    Returns V [n_words, P] uint32 (31 payload bits each): bit i of the pattern is
    1 - (LCS(a[:i+1], b) - LCS(a[:i], b)). With col_bits [P, Lb] int32 it also returns
    counts [Lb + ks - 1, P] uint32 (rows >= Lb are padding): counts[c] = the number of ones among
    the low col_bits[:, c] bits of V right after text column c, so that
    LCS(a[:r], b[:c + 1]) = r - counts[c] for r = col_bits[:, c] (one popcount per word and
    column, summed up the stripes like the carry; no per-column copy of V is kept). Only the
    columns from `count_from` (an int32 scalar, default 0) on are counted, the others read 0:
    the steps before it skip the popcount.
    """
    n_pairs = a.shape[0]
    ra, rb, ks, n_stripes, steps = _striped_inputs(a, b, a_len, b_len, tiling)
    count = col_bits is not None
    r_pad = jnp.pad(col_bits.T, ((ks - 1, ks - 1), (0, 0))) if count else None

    def stripe(q, carry):
        cin, nin, words = carry  # [steps, P]: carry / count into the stripe's bottom word
        table, ids_pad = _stripe_setup(ra, rb, q, ks)  # id 0 = no match outside the text
        base = (q * ks + jnp.arange(ks))[:, None] * _BITS

        def update(x, s):
            pm = _skewed_gather(table, ids_pad, s, ks)
            v = x & _M31
            u = v & pm
            # V' = (V + U + c) | (V - U); U is a subset of V so V - U = V & ~U. The sum of two
            # 31-bit words and a carry fits 32 bits: bit 31 is the carry for the word above.
            return (v + u + _shift_up(x >> 31, cin[s])) | (v & ~u)

        x0 = jnp.full((ks, n_pairs), _M31, jnp.uint32)
        if count:
            x, cout, nout = _counted_scan(update, x0, steps, count_from, lambda x, part, s: (
                _column_counts(x, r_pad, s, base, part, nin[s])))
        else:
            def step(x, s):
                x = update(x, s)
                return x, x[ks - 1] >> 31
            x, cout = lax.scan(step, x0, jnp.arange(steps))
        # the top word handled column s - (ks - 1) at step s
        tail = jnp.zeros((ks - 1, n_pairs), jnp.uint32)
        cin = jnp.concatenate([cout[ks - 1:], tail])
        nin = jnp.concatenate([nout[ks - 1:], tail]) if count else nin
        words = lax.dynamic_update_slice_in_dim(words, x & _M31, q * ks, axis=0)
        return cin, nin, words

    zeros = jnp.zeros((steps, n_pairs), jnp.uint32)
    init = (zeros, zeros if count else jnp.zeros((), jnp.uint32),
            jnp.zeros((n_stripes * ks, n_pairs), jnp.uint32))
    _, counts, words = lax.fori_loop(0, n_stripes, stripe, init)
    return (words, counts) if count else words


def _put(buf, row, s):
    """buf[s] = row as an in-place dynamic-update-slice (`.at[s].set` would be a scatter, which
    XLA:CPU runs about 2x slower inside the loop)."""
    return lax.dynamic_update_index_in_dim(buf, row, s, axis=0)


def _counted_scan(update, x0, steps, count_from, counts):
    """The stripe's scan when columns are counted: steps [0, count_from) run `update` alone,
    the rest also carry the partial counts (`counts(x, part, s)`). Step s handles column s - k
    in word k, so every column >= count_from is counted in full. Returns (x, carries out of the
    top word [steps, P], counts out of the top word [steps, P]; 0 before count_from).

    Both outputs share one [steps, 2P] buffer: two carried buffers made XLA:CPU's loop ~1.5x
    slower than lax.scan's, one is level with it.
    """
    ks, n_pairs = x0.shape
    start = jnp.clip(jnp.asarray(0 if count_from is None else count_from, jnp.int32), 0, steps)
    zero = jnp.zeros((n_pairs,), jnp.uint32)

    def plain(s, st):
        x, buf = st
        x = update(x, s)
        return x, _put(buf, jnp.concatenate([x[ks - 1] >> 31, zero]), s)

    def counted(s, st):
        x, part, buf = st
        x = update(x, s)
        part = counts(x, part, s)
        return x, part, _put(buf, jnp.concatenate([x[ks - 1] >> 31, part[ks - 1]]), s)

    buf = jnp.zeros((steps, 2 * n_pairs), jnp.uint32)
    x, buf = lax.fori_loop(0, start, plain, (x0, buf))
    x, _, buf = lax.fori_loop(start, steps, counted, (x, jnp.zeros_like(x0), buf))
    return x, buf[:, :n_pairs], buf[:, n_pairs:]


def _low_bits_mask(n_words, length):
    """[n_words, P] uint32 masks keeping the low `length` [P] pattern bits."""
    nbits = jnp.clip(length[None, :] - _BITS * jnp.arange(n_words)[:, None], 0, _BITS)
    return jnp.left_shift(jnp.uint32(1), nbits.astype(jnp.uint32)) - 1


def _popcount(x):
    return lax.population_count(x).astype(jnp.int32).sum(axis=0)


def _lcs_first_error_chunk(a, b, a_len, b_len, *, tiling: Tiling | None = None):
    """`lcs_first_error_batch` for one chunk of pairs."""
    v = lcs_words(a, b, a_len, b_len, tiling=tiling)
    lcs = a_len - _popcount(v & _low_bits_mask(v.shape[0], a_len))
    # trailing zeros per word (31 for an all-zero word), summed while all lower words are zero
    tz = jnp.where(v == 0, _BITS, lax.population_count((v & (~v + 1)) - 1).astype(jnp.int32))
    zero_below = jnp.cumprod(jnp.concatenate(
        [jnp.ones_like(v[:1], dtype=jnp.int32), (v[:-1] == 0).astype(jnp.int32)]), axis=0)
    first_error = jnp.minimum((tz * zero_below).sum(axis=0), a_len)
    return lcs, first_error


def greedy_embedding(a, b, a_len, b_len):
    """Leftmost embedding of a's prefixes in b: one scan over b's columns.

    a [P, La], b [P, Lb] int32; a_len, b_len [P]. Returns q [P, La + 1] int32 with q[:, k] the
    end of the greedy embedding of a[:k] in b[:b_len] (q[:, 0] = 0; -1 where a[:k] is not a
    subsequence of b), and f [P] = max{k : a[:k] is a subsequence of b} (the prefix rule).

    The columns go `_GREEDY_BLOCK` at a time: k advances at most once per column, so the block's
    symbols a[k : k + _GREEDY_BLOCK + 1] are gathered once and each column picks the one it
    needs by a masked sum over that window. A gather per column cost 3-4x more: XLA:CPU's
    gathers do not vectorize.
    """
    n_pairs, n_a = a.shape
    n_b, block = b.shape[1], _GREEDY_BLOCK
    n_blocks = -(-n_b // block)
    cols = jnp.arange(n_blocks * block, dtype=jnp.int32)
    live = cols[:, None] < b_len[None, :]  # [columns, P]
    b_t = jnp.pad(b.T, ((0, n_blocks * block - n_b), (0, 0)))
    span = jnp.arange(block + 1)

    def columns(k, xs):
        b_blk, live_blk = xs  # [block, P]
        window = jnp.take_along_axis(a, jnp.minimum(k[:, None] + span, n_a - 1), axis=1)
        k0 = k

        def column(k, x):
            bj, lj = x
            need = jnp.sum(jnp.where(span == (k - k0)[:, None], window, 0), axis=1)  # a[k]
            hit = lj & (k < a_len) & (bj == need)
            k = k + hit.astype(jnp.int32)
            return k, jnp.where(hit, k, n_a + 1)  # n_a + 1: dropped by the scatter below

        return lax.scan(column, k, (b_blk, live_blk))

    shape = (n_blocks, block, n_pairs)
    f, reached = lax.scan(columns, jnp.zeros((n_pairs,), jnp.int32),
                          (b_t.reshape(shape), live.reshape(shape)))
    reached = reached.reshape(n_blocks * block, n_pairs)[:n_b]
    pp = jnp.arange(n_pairs)
    q = jnp.full((n_pairs, n_a + 1), -1, jnp.int32).at[:, 0].set(0)
    q = q.at[pp[None, :], reached].set(jnp.broadcast_to(cols[:n_b, None] + 1, reached.shape),
                                         mode="drop")
    return q, f


def _reverse(x, length):
    """x [P, L] -> each row's first `length` entries reversed (padding after is arbitrary)."""
    idx = length[:, None] - 1 - jnp.arange(x.shape[1])[None, :]
    return jnp.take_along_axis(x, jnp.clip(idx, 0, x.shape[1] - 1), axis=1)


def _lcs_alignment_chunk(a, b, a_len, b_len, q=None, f=None, *, tiling: Tiling | None = None):
    """`lcs_alignment_batch` for one chunk of pairs (q, f: `greedy_embedding`, computed here
    when not given).

    One backward pass over a (text = a reversed, pattern = b reversed): after the text column
    holding a[k], the low r bits of V give LCS(a[k:], b[m - r:]) for every r; the kernel counts
    them at r_k = m - q_k only.
    """
    n_a = a.shape[1]
    if q is None:
        q, f = greedy_embedding(a, b, a_len, b_len)
    k = a_len[:, None] - 1 - jnp.arange(n_a)[None, :]  # [P, La]: a[k] at backward column c
    live = (k >= 0) & (k <= f[:, None])  # q_k is defined exactly for k <= f
    q_k = jnp.take_along_axis(q, jnp.clip(k, 0, n_a), axis=1)
    r = jnp.where(live, b_len[:, None] - q_k, 0)  # bits of reversed b that stand for b[q_k:]
    # only the columns of live k are read; pairs whose a embeds whole (f = a_len) need none
    needed = (a_len > 0) & (f < a_len)
    count_from = jnp.min(jnp.where(needed, a_len - 1 - f, n_a))
    v, counts = lcs_words(_reverse(b, b_len), _reverse(a, a_len), b_len, a_len, col_bits=r,
                          count_from=count_from, tiling=tiling)
    lcs = b_len - _popcount(v & _low_bits_mask(v.shape[0], b_len))
    rest = r - counts[:n_a].T.astype(jnp.int32)  # LCS(a[k:], b[q_k:])
    ok = live & (k + rest == lcs[:, None])
    first_error = jnp.where(f == a_len, a_len, jnp.max(jnp.where(ok, k, 0), axis=1))
    return lcs, first_error


def _levenshtein_chunk(a, b, a_len, b_len, *, tiling: Tiling | None = None):
    """`levenshtein_batch` for one chunk of pairs.

    Myers' block recurrence with vertical deltas Pv/Mv per word; the horizontal delta leaving
    a word (+1/-1 in bit 31 of Pv/Mv) is the h_in of the word above at the same column, which
    replaces the carry of the addition ("Eq |= 1 when h_in < 0"). Row 0 has D[0][j] = j, so
    the bottom stripe gets h_in = +1 on every text column. D[m][n] = n + #Pv - #Mv (low m bits).
    """
    n_pairs = a.shape[0]
    ra, rb, ks, n_stripes, steps = _striped_inputs(a, b, a_len, b_len, tiling)
    kk = jnp.arange(ks)[:, None]
    top = jnp.uint32(_TOP)

    def stripe(q, carry):
        hin_bottom, pv_words, mv_words = carry  # hin_bottom [steps, P]: bit 0 = +1, bit 1 = -1
        table, ids_pad = _stripe_setup(ra, rb, q, ks)

        def step(state, s):
            pstate, mstate = state
            col = s - kk
            active = (col >= 0) & (col < b_len[None, :])  # columns past b_len leave D unchanged
            hin = hin_bottom[s]
            # Pv' and Mv' come out of two kernels that each redo the whole update. Their match
            # words and h_in shifts are written two different ways on purpose: shared, XLA
            # materialises them in extra per-step kernels, which costs more (1.3-1.8x measured)
            # than gathering twice.
            ph, mh, xv = _myers(_skewed_gather(table, ids_pad, s, ks), pstate, mstate,
                                _shift_up(pstate >> 31, hin & 1), _shift_up(mstate >> 31, hin >> 1))
            pstate_new = jnp.where(active, ((mh | ~(xv | ph)) & _M31) | (ph & top), pstate & _M31)
            ph, mh, xv = _myers(_skewed_gather_flat(table, ids_pad, s, ks), pstate, mstate,
                                _shift_up(pstate, hin << 31) >> 31,
                                _shift_up(mstate, (hin >> 1) << 31) >> 31)
            mstate = jnp.where(active, (ph & xv & _M31) | (mh & top), mstate & _M31)
            out = (pstate_new[ks - 1] >> 31) | ((mstate[ks - 1] >> 31) << 1)
            return (pstate_new, mstate), out

        init = (jnp.full((ks, n_pairs), _M31, jnp.uint32), jnp.zeros((ks, n_pairs), jnp.uint32))
        (pstate, mstate), hout = lax.scan(step, init, jnp.arange(steps))
        hin_bottom = jnp.concatenate([hout[ks - 1:], jnp.zeros((ks - 1, n_pairs), jnp.uint32)])
        pv_words = lax.dynamic_update_slice_in_dim(pv_words, pstate & _M31, q * ks, axis=0)
        mv_words = lax.dynamic_update_slice_in_dim(mv_words, mstate & _M31, q * ks, axis=0)
        return hin_bottom, pv_words, mv_words

    cols = jnp.arange(steps)[:, None]
    hin0 = (cols < b_len[None, :]).astype(jnp.uint32)  # +1 on the real text columns
    zeros = jnp.zeros((n_stripes * ks, n_pairs), jnp.uint32)
    _, pv, mv = lax.fori_loop(0, n_stripes, stripe, (hin0, zeros, zeros))
    mask = _low_bits_mask(pv.shape[0], a_len)
    return b_len + _popcount(pv & mask) - _popcount(mv & mask)


def _in_chunks(kernel, tiling: Tiling | None, *args):
    """Runs `kernel` under `tiling` (None: `current_tiling()`) over chunks of at most its
    `chunk_pairs` pairs (lax.map) and restores [P]; every argument has the pair axis first.

    Keeps the stripe width, the match table and the per-stripe maps at their single-chunk
    sizes, so the cost grows linearly with the number of pairs.
    """
    tiling = tiling or current_tiling()
    kernel = functools.partial(kernel, tiling=tiling)
    n_pairs, chunk = args[0].shape[0], tiling.chunk_pairs
    if n_pairs <= chunk:
        return kernel(*args)
    n_chunks = -(-n_pairs // chunk)
    extra = n_chunks * chunk - n_pairs  # padding pairs have zero lengths
    args = [jnp.pad(x, ((0, extra),) + ((0, 0),) * (x.ndim - 1)) for x in args]
    args = [x.reshape((n_chunks, chunk) + x.shape[1:]) for x in args]
    out = lax.map(lambda xs: kernel(*xs), args)
    return jax.tree.map(lambda y: y.reshape((n_chunks * chunk,) + y.shape[2:])[:n_pairs], out)


def lcs_first_error_batch(a, b, a_len, b_len, *, tiling: Tiling | None = None):
    """LCS(a[:a_len], b[:b_len]) and first-error position for P pairs, in one DP pass.

    a [P, La], b [P, Lb] int32; a_len, b_len [P] int32 -> (lcs [P], first_error [P]) int32.
    first_error = max{k : LCS(a[:k], b) = k} = number of trailing zero bits of V (bit i is 0
    exactly when pattern row i + 1 gains one on row i), capped at a_len.
    """
    return _in_chunks(_lcs_first_error_chunk, tiling, a, b, a_len, b_len)


def lcs_alignment_batch(a, b, a_len, b_len, *, tiling: Tiling | None = None):
    """LCS(a[:a_len], b[:b_len]) and the first unit of a left unmatched by an optimal LCS
    alignment, the latest among optimal alignments (DESIGN §2, alignment="lcs"):
    e = max{k : q_k defined and k + LCS(a[k:], b[q_k:]) = LCS(a, b)}, q_k the end of the greedy
    embedding of a[:k] in b. Same shapes as lcs_first_error_batch. Cost: one LCS pass, with a
    masked popcount per word and column from column a_len - 1 - f on (the earliest in a chunk
    of pairs; f = the prefix rule's first error), plus one scan over b for the greedy
    embedding.
    """
    # the greedy scan is cheap per column: one scan over all pairs, not one per chunk
    q, f = greedy_embedding(a, b, a_len, b_len)
    return _in_chunks(_lcs_alignment_chunk, tiling, a, b, a_len, b_len, q, f)


def levenshtein_batch(a, b, a_len, b_len, *, tiling: Tiling | None = None):
    """Levenshtein distance (unit costs) for P pairs. Same shapes as lcs_first_error_batch."""
    return _in_chunks(_levenshtein_chunk, tiling, a, b, a_len, b_len)
