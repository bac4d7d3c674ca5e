"""Counterfactual comparison operator φ and per-unit credit Δ (DESIGN §2, paper §3.2-§3.3).

A response is cut into units (reasoning steps, or tokens); each wrong response i of a group is
compared with every correct response j of the same group. All functions are jittable and
vmappable, take int32 arrays padded to static lengths, and never look at padding: values
beyond a length are arbitrary.

First error e_ij (DESIGN §2, `alignment`): "lcs" (default) = the first unit of u_i left
unmatched by an optimal LCS alignment with u_j, the latest one among optimal alignments;
"prefix" (v1) = the longest prefix of u_i that is a subsequence of u_j. Reduction over the
correct j (`reduce`): "max" = the best match j* (lowest j among ties), Δ from j*; "mean" = the
average over all correct j, of φ and of Δ alike.

Pair kernels: `lcs_first_error` and `edit_distance` compare one pair; under `jax.vmap` (any
nesting) they route, through `jax.custom_batching.custom_vmap`, to one bit-parallel kernel call
over all pairs (`ibpo_jax._bitparallel`). `compute_phi` compares the G x G pairs of a group in one
such call, and a vmap over groups merges all groups' pairs into the same single call.

Unit budget: by default every unit of a response has a slot (token units: the response width;
steps: (T + 1) // 2, the most steps T tokens can hold), so no budget changes φ. A smaller
`max_units` (memory) covers only the first units: `response_units` flags such rows
(`truncated`), their uncovered tail is left out of φ's denominator and out of Δ (its tokens get
the sequence credit φ_i, see `token_delta`). A cap can still move φ of a row that fits it through
a truncated correct peer (its dropped units can no longer be matched): only the default budget
makes φ exact; log the truncated fraction whenever a cap is set.

Step units (`split_steps`) are hashed on device to one int32 per step (see `_hash_steps` for the
collision rate).

Per-unit credit Δ (DESIGN §2): for `lcs_first_error`, 1 on the units before the first error and
0 from it on (mean over units = e/n = φ; "mean" averages these indicators over correct j); for
`lcs` and `edit_distance`, whose φ is not a prefix length, Δ = φ on every unit, so that mean
Δ = φ still holds and `credit="token"` reduces to sequence credit. `token_delta` rescales Δ per
response so that its mean over the loss tokens is φ_i as well.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from ibpo_jax import _bitparallel
from ibpo_jax.losses import safe_div
from ibpo_jax.registry import OPERATORS

ALIGNMENTS = ("lcs", "prefix")
REDUCTIONS = ("max", "mean")
GRANULARITIES = ("step", "token")

# ---------------------------------------------------------------------------------------------
# Pair kernels


def _check_pair(a, b, a_len, b_len) -> None:
    for name, x, nd in (("a", a, 2), ("b", b, 2), ("a_len", a_len, 1), ("b_len", b_len, 1)):
        if x.ndim != nd or not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"comparison: {name} must be an integer array of rank {nd - 1} per "
                             f"pair, got dtype {x.dtype} shape {x.shape[1:]}")


def _as_pairs(a, b, a_len, b_len):
    """int32, and static lengths >= 1 (a zero-length axis gets one padding slot)."""
    a, b = (jnp.pad(x, ((0, 0), (0, max(0, 1 - x.shape[1])))).astype(jnp.int32) for x in (a, b))
    # lengths outside [0, L] are clipped so padding never counts as content
    a_len = jnp.clip(a_len.astype(jnp.int32), 0, a.shape[1])
    b_len = jnp.clip(b_len.astype(jnp.int32), 0, b.shape[1])
    return a, b, a_len, b_len


def _batched(kernel):
    """A [P, ...] pair kernel whose vmap folds the new batch axis into P (one kernel call)."""

    @custom_vmap
    def fn(a, b, a_len, b_len):
        _check_pair(a, b, a_len, b_len)
        return kernel(*_as_pairs(a, b, a_len, b_len))

    @fn.def_vmap
    def _rule(axis_size, in_batched, a, b, a_len, b_len):
        args = [x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape)
                for x, batched in zip((a, b, a_len, b_len), in_batched)]
        n = args[0].shape[1]
        out = fn(*(x.reshape((axis_size * n,) + x.shape[2:]) for x in args))
        out = jax.tree.map(lambda y: y.reshape((axis_size, n) + y.shape[1:]), out)
        return out, jax.tree.map(lambda _: True, out)

    return fn


_LCS_KERNELS = {"lcs": _bitparallel.lcs_alignment_batch,
                "prefix": _bitparallel.lcs_first_error_batch}


@functools.cache
def _tiled(kernel, tiling: _bitparallel.Tiling):
    """`kernel` under `tiling` as a pair function. One object per (kernel, tiling): jax 0.11
    caches a custom_vmap's trace by its function object, so one object reading the tiling
    inside replays the first tiling's program (seen on an H200; RESULTS.md)."""
    return _batched(functools.partial(kernel, tiling=tiling))


def _lcs_pairs(alignment: str):
    return _tiled(_LCS_KERNELS[alignment], _bitparallel.current_tiling())


def _lev_pairs(*pairs):
    return _tiled(_bitparallel.levenshtein_batch, _bitparallel.current_tiling())(*pairs)


def _choice(value: str, valid: tuple[str, ...], key: str) -> str:
    if value not in valid:
        raise ValueError(f"comparison: unknown {key} {value!r} (config key {key}); valid: "
                         f"{', '.join(valid)}")
    return value


def _one_pair(fn, a, b, a_len, b_len):
    a, b, a_len, b_len = map(jnp.asarray, (a, b, a_len, b_len))
    if a.ndim != 1 or b.ndim != 1 or a_len.ndim != 0 or b_len.ndim != 0:
        raise ValueError("comparison: expected a [La], b [Lb] and scalar lengths (use jax.vmap "
                         f"for batches), got shapes {a.shape}, {b.shape}, {a_len.shape}, "
                         f"{b_len.shape}")
    out = fn(a[None], b[None], a_len[None], b_len[None])
    return jax.tree.map(lambda y: y[0], out)


def lcs_first_error(a: jax.Array, b: jax.Array, a_len: jax.Array, b_len: jax.Array, *,
                    alignment: str = "lcs") -> tuple[jax.Array, jax.Array]:
    """LCS length and first-error position e of a[:a_len] against b[:b_len] (DESIGN §2).

    a: [La] int32, b: [Lb] int32, a_len, b_len: int32 scalars (clipped to [0, L]).
    Returns (lcs, first_error), int32 scalars, e in [0, a_len]:
    - alignment="lcs": e = max{k : q_k defined and k + LCS(a[k:], b[q_k:]) = LCS(a, b)}, q_k
      the end of the greedy embedding of a[:k] in b: the first unit of a left unmatched by an
      optimal alignment, the latest among optimal alignments ([5,1,2,3,4] vs [1,2,3,4,5]: 0).
    - alignment="prefix" (v1): e = max{k : LCS(a[:k], b) = k} ([5,1,2,3,4] vs [1,2,3,4,5]: 1).
    """
    fn = _lcs_pairs(_choice(alignment, ALIGNMENTS, "ibpo.alignment"))
    return _one_pair(fn, a, b, a_len, b_len)


def edit_distance(a: jax.Array, b: jax.Array, a_len: jax.Array, b_len: jax.Array) -> jax.Array:
    """Levenshtein distance (unit insert/delete/substitute costs) of a[:a_len] and b[:b_len].

    a: [La] int32, b: [Lb] int32, a_len, b_len: int32 scalars. Returns an int32 scalar.
    """
    return _one_pair(_lev_pairs, a, b, a_len, b_len)


# ---------------------------------------------------------------------------------------------
# Units

_HASH_BASE = 0x01000193  # odd multiplier (FNV prime) for the polynomial step hash
_HASH_SEED = 0x9E3779B9


def _mix32(x):
    """murmur3 fmix32 finalizer: a bijection on uint32 with full avalanche."""
    x ^= x >> 16
    x *= jnp.uint32(0x85EBCA6B)
    x ^= x >> 13
    x *= jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def _step_structure(tokens, length, is_delim):
    """Per token: (is a step token, step index (-1 before the first step), step start pos)."""
    tokens, length, is_delim = map(jnp.asarray, (tokens, length, is_delim))
    if tokens.ndim != 1 or is_delim.ndim != 1:
        raise ValueError(f"split_steps: expected tokens [T] and is_delim [V], got shapes "
                         f"{tokens.shape} and {is_delim.shape}")
    n = tokens.shape[0]
    pos = jnp.arange(n)
    valid = pos < length
    # ids outside the vocabulary table count as step tokens (clamped lookups would alias them)
    in_vocab = (tokens >= 0) & (tokens < is_delim.shape[0])
    delim = valid & in_vocab & is_delim.astype(bool)[jnp.clip(tokens, 0, is_delim.shape[0] - 1)]
    word = valid & ~delim
    prev_word = jnp.concatenate([jnp.zeros((1,), bool), word[:-1]])
    start = word & ~prev_word
    step = jnp.cumsum(start.astype(jnp.int32)) - 1  # delimiters keep the index of the step before
    start_pos = jax.lax.cummax(jnp.where(start, pos, -1), axis=0)
    return word, delim, step, start_pos


def _hash_steps(tokens, word, step, start_pos, n_slots):
    """One uint32 hash per step: fmix32(seed-mixed polynomial of the token ids, step length).

    h = Σ_q mix(tok_q) · B^q over the step's tokens (q = position inside the step, uint32
    wrap-around), summed per step with a segment sum, then finalized with the step length.
    Distinct steps collide with probability ~2^-32 per pair, so among N distinct steps the
    chance of any collision is ~N²/2^33 (about 1e-4 for N = 1000); a collision can only make
    two different steps count as equal, i.e. slightly overstate an LCS.
    """
    n = tokens.shape[0]
    powers = jnp.cumprod(jnp.full((n,), _HASH_BASE, jnp.uint32).at[0].set(1))
    offset = jnp.clip(jnp.arange(n) - start_pos, 0, n - 1)
    term = _mix32(tokens.astype(jnp.uint32) ^ jnp.uint32(_HASH_SEED)) * powers[offset]
    seg = jnp.where(word, step, n_slots)
    poly = jnp.zeros((n_slots,), jnp.uint32).at[seg].add(term, mode="drop")
    count = jnp.zeros((n_slots,), jnp.uint32).at[seg].add(jnp.uint32(1), mode="drop")
    return _mix32(poly ^ _mix32(count + jnp.uint32(_HASH_SEED)))


def _step_budget(n_tokens: int, max_units: int | None, where: str) -> int:
    """Unit slots per response: max_units, or (T + 1) // 2, the most steps T tokens hold."""
    n_slots = max(1, (n_tokens + 1) // 2) if max_units is None else int(max_units)
    if n_slots < 1:
        raise ValueError(f"{where}: max_units (config key ibpo.max_units) must be >= 1 or "
                         f"None, got {max_units}")
    return n_slots


def _split(tokens, length, is_delim, n_slots):
    """(units [n_slots], covered units, all steps of the response)."""
    n = tokens.shape[0]
    word, _, step, start_pos = _step_structure(tokens, length, is_delim)
    n_steps = jnp.sum((word & (start_pos == jnp.arange(n))).astype(jnp.int32))
    n_units = jnp.minimum(n_steps, n_slots)
    h = _hash_steps(tokens, word, step, start_pos, n_slots)
    units = jnp.where(jnp.arange(n_slots) < n_units, jax.lax.bitcast_convert_type(h, jnp.int32), 0)
    return units, n_units, n_steps


def split_steps(tokens: jax.Array, length: jax.Array, is_delim: jax.Array, *,
                max_units: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Cuts a response into reasoning steps and hashes each step to one int32 id (DESIGN §2).

    tokens: [T] int32, length: int32 scalar (tokens[length:] are ignored), is_delim: [V] bool
    over the vocabulary. A step is a maximal run of non-delimiter tokens; delimiters only
    separate steps and are not hashed, empty runs vanish. Token ids outside [0, V) count as
    non-delimiters.
    Returns units [U] int32 (U = max_units, default (T + 1) // 2, which holds every step; entries
    past n_units are 0) and n_units, an int32 scalar. Steps beyond max_units are dropped
    (`response_units` reports such rows as truncated).
    """
    tokens = jnp.asarray(tokens)
    n_slots = _step_budget(tokens.shape[0], max_units, "split_steps")
    units, n_units, _ = _split(tokens, length, is_delim, n_slots)
    return units, n_units


def token_unit_index(tokens: jax.Array, length: jax.Array, is_delim: jax.Array, *,
                     max_units: int | None = None) -> jax.Array:
    """The step each token belongs to, for handing every token its unit's Δ.

    Same arguments as `split_steps`. Returns [T] int32: a step token gets its step's index; a
    delimiter gets the step it terminates, i.e. the step before it (a run of delimiters all
    close the same step; delimiters before the first step get -1); tokens at or after
    `length` get -1; tokens of steps beyond max_units (the uncovered tail) get -2.
    """
    tokens = jnp.asarray(tokens)
    n_slots = _step_budget(tokens.shape[0], max_units, "token_unit_index")
    _, _, step, _ = _step_structure(tokens, length, is_delim)
    valid = (jnp.arange(tokens.shape[0]) < length) & (step >= 0)
    return jnp.where(valid, jnp.where(step < n_slots, step, -2), -1)


def token_units(tokens: jax.Array, length: jax.Array) -> tuple[jax.Array, jax.Array]:
    """granularity="token": the units are the token ids themselves.

    tokens: [T] int32, length: int32 scalar. Returns (units [T] int32 with 0 past length,
    n_units = length). The matching token -> unit index is `jnp.where(arange(T) < length,
    arange(T), -1)`.
    """
    tokens = jnp.asarray(tokens)
    keep = jnp.arange(tokens.shape[0]) < length
    return jnp.where(keep, tokens, 0).astype(jnp.int32), jnp.asarray(length, jnp.int32)


def units_to_tokens(values: jax.Array, token_unit: jax.Array) -> jax.Array:
    """Per-unit values to per-token values. values: [..., U], token_unit: [..., T] int32
    (< 0 = no unit) -> [..., T], 0 where token_unit < 0."""
    values, token_unit = jnp.asarray(values), jnp.asarray(token_unit)
    idx = jnp.clip(token_unit, 0, values.shape[-1] - 1)
    picked = jnp.take_along_axis(values, idx, axis=-1)
    return jnp.where(token_unit >= 0, picked, jnp.zeros((), values.dtype))


class Units(NamedTuple):
    """Comparison units of N responses (`response_units`).

    units: [N, U] int32; n_units: [N] int32 covered units; token_unit: [N, T] int32, each
    token's unit (-1: none, i.e. EOS, padding, leading delimiters; -2: beyond the unit budget);
    truncated: [N] bool, the response has more units than U (log its mean as
    units_truncated_frac).
    """

    units: jax.Array
    n_units: jax.Array
    token_unit: jax.Array
    truncated: jax.Array


def _token_granularity(tokens, length, n_slots):
    units, n_units = jax.vmap(token_units)(tokens, length)
    width = tokens.shape[1]
    units = jnp.pad(units, ((0, 0), (0, max(0, n_slots - width))))[:, :n_slots]
    covered = jnp.minimum(n_units, n_slots)
    pos = jnp.arange(width)[None, :]
    token_unit = jnp.where(pos < covered[:, None], pos, jnp.where(pos < length[:, None], -2, -1))
    return Units(units, covered, token_unit, n_units > n_slots)


def response_units(tokens: jax.Array, response_len: jax.Array, ended: jax.Array,
                   is_delim: jax.Array | None, *, granularity: str = "step",
                   max_units: int | None = None) -> Units:
    """Units of a batch of responses for the comparison (DESIGN §1-§2).

    tokens: [N, T] int32 response tokens, response_len: [N] int32 (EOS included when ended),
    ended: [N] bool (the row ends with EOS), is_delim: [V] bool (step granularity only).
    The comparison never sees EOS: a row with ended=True drops its last token, a row that ran
    out of tokens (ended=False) keeps all of them. max_units: unit slots per row, default
    every unit (token: T; step: (T + 1) // 2); a smaller budget truncates (see `Units`).
    """
    tokens = jnp.asarray(tokens)
    _choice(granularity, GRANULARITIES, "ibpo.granularity")
    length = (jnp.asarray(response_len) - jnp.asarray(ended).astype(jnp.int32)).astype(jnp.int32)
    width = tokens.shape[1]
    if granularity == "token":
        n_slots = width if max_units is None else _step_budget(width, max_units, "response_units")
        return _token_granularity(tokens, jnp.maximum(length, 0), n_slots)
    if is_delim is None:
        raise ValueError("response_units: granularity='step' needs the tokenizer's is_delim table")
    n_slots = _step_budget(width, max_units, "response_units")
    units, n_units, n_steps = jax.vmap(lambda t, n: _split(t, n, is_delim, n_slots))(tokens, length)
    token_unit = jax.vmap(lambda t, n: token_unit_index(t, n, is_delim, max_units=n_slots))(
        tokens, length)
    return Units(units, n_units, token_unit, n_steps > n_units)


def token_delta(delta: jax.Array, phi: jax.Array, token_unit: jax.Array,
                loss_len: jax.Array) -> jax.Array:
    """Per-token credit whose mean over the loss tokens is φ_i (DESIGN §2, last paragraph).

    delta: [N, U] per-unit Δ, phi: [N], token_unit: [N, T] (`Units.token_unit`), loss_len: [N]
    tokens the loss averages over (EOS included). Each covered token inherits its unit's Δ,
    scaled per response by s_i so that the token mean is φ_i: the per-token credit
    redistributes φ along the response without changing its total. EOS (and tokens of no unit)
    get 0, tokens past the unit budget (-2) get φ_i itself (no alignment there), padding 0.
    Returns [N, T] float32; rows with φ_i = 0 are all 0, never NaN.
    """
    phi = jnp.asarray(phi, jnp.float32)
    raw = units_to_tokens(jnp.asarray(delta, jnp.float32), token_unit)
    in_loss = jnp.arange(token_unit.shape[-1])[None, :] < jnp.asarray(loss_len)[:, None]
    tail = in_loss & (token_unit == -2)
    scaled = in_loss & ~tail  # covered tokens, EOS, leading delimiters
    n_scaled = jnp.sum(scaled, axis=-1).astype(jnp.float32)
    scale = safe_div(phi * n_scaled, jnp.sum(jnp.where(scaled, raw, 0.0), axis=-1))
    out = jnp.where(tail, phi[:, None], raw * scale[:, None])
    return jnp.where(in_loss, out, 0.0)


# ---------------------------------------------------------------------------------------------
# φ over one group


class Phi(NamedTuple):
    """Result of `compute_phi` for a group of G responses with U unit slots.

    phi: [G] float32 in [0, 1]; 0 for correct responses and when the group has no correct one.
    delta: [G, U] float32 per-unit credit; its mean over the first n_i units is exactly phi_i.
    first_error: [G] int32. Wrong non-empty i with a correct peer: e_{i j*}, the first error
        (under the chosen alignment) against the best match j*; correct i: n_i; any other wrong
        i (empty, or no correct response in the group): 0.
    best_match: [G] int32, j* = argmax_j of the operator's score (lowest index among ties; also
        reported for reduce="mean"); -1 for correct i, empty i and when the group has no
        correct response.
    """

    phi: jax.Array
    delta: jax.Array
    first_error: jax.Array
    best_match: jax.Array


def _group_pairs(units, n_units):
    """All G x G (pattern i, text j) pairs of a group, flattened row-major: (a, b, a_len,
    b_len) with a, b [G*G, U] and the lengths [G*G]."""
    g, n = units.shape
    a = jnp.broadcast_to(units[:, None, :], (g, g, n)).reshape(g * g, n)
    b = jnp.broadcast_to(units[None, :, :], (g, g, n)).reshape(g * g, n)
    return a, b, jnp.repeat(n_units, g), jnp.tile(n_units, g)


def _check_group(units, n_units, correct) -> None:
    if units.ndim != 2:
        raise ValueError(f"compute_phi: units must be [G, U] for one group (vmap over groups), "
                         f"got shape {units.shape}")
    if n_units.shape != units.shape[:1] or correct.shape != units.shape[:1]:
        raise ValueError(f"compute_phi: n_units and correct must be [G] = {units.shape[:1]}, got "
                         f"{n_units.shape} and {correct.shape}")


def _first_errors(units, n_units, alignment):
    """(LCS [G, G], e [G, G]) of every (i, j) pair of the group, one kernel call."""
    g = units.shape[0]
    lcs, e = _lcs_pairs(alignment)(*_group_pairs(units, n_units))
    return lcs.reshape(g, g), e.reshape(g, g)


def first_error_matrix(units: jax.Array, n_units: jax.Array, *, alignment: str = "lcs"
                       ) -> jax.Array:
    """e [G, G] int32 of one group: e[i, j] = the first error of response i against response
    j under `alignment` (DESIGN §2), the value `compute_phi` reads for its peer j*."""
    _choice(alignment, ALIGNMENTS, "ibpo.alignment")
    units, n_units = jnp.asarray(units, jnp.int32), jnp.asarray(n_units, jnp.int32)
    return _first_errors(units, n_units, alignment)[1]


def _reduce(score, e, n_units, correct, reduce: str) -> Phi:
    """Reduction over correct j of score [G, G] -> Phi (Δ from `_with_delta`).
    e: first errors [G, G]."""
    g = score.shape[0]
    has_match = ~correct & jnp.any(correct) & (n_units > 0)
    best = jnp.argmax(jnp.where(correct[None, :], score, -jnp.inf), axis=1).astype(jnp.int32)
    e_best = jnp.take_along_axis(e, best[:, None], 1)[:, 0]
    weight = correct[None, :].astype(jnp.float32)  # [1, G]: mean over correct j
    if reduce == "max":
        phi = jnp.take_along_axis(score, best[:, None], 1)[:, 0]
    else:
        phi = safe_div(jnp.sum(score * weight, 1), jnp.sum(weight))
    phi = jnp.where(has_match, phi, 0.0).astype(jnp.float32)
    first_error = jnp.where(correct, n_units, jnp.where(has_match, e_best, 0)).astype(jnp.int32)
    return Phi(phi=phi, delta=jnp.zeros((g, 0), jnp.float32), first_error=first_error,
               best_match=jnp.where(has_match, best, -1))


def _with_delta(out: Phi, e, n_units, correct, n_slots: int, reduce: str, *,
                prefix_delta: bool) -> Phi:
    """Δ [G, U] whose mean over the n_i units is φ_i (DESIGN §2)."""
    slot = jnp.arange(n_slots)
    in_unit = slot[None, :] < n_units[:, None]
    if not prefix_delta:
        # `lcs` / `edit_distance`: φ is not a prefix length, so the credit is spread uniformly
        return out._replace(delta=jnp.where(in_unit, out.phi[:, None], 0.0))
    live = (out.phi > 0)[:, None]
    if reduce == "max":  # 1 before the first error of j*, 0 from it on
        delta = (slot[None, :] < out.first_error[:, None]).astype(jnp.float32)
    else:  # the fraction of correct j whose first error lies past the unit
        before = (slot[None, None, :] < e[:, :, None]) & correct[None, :, None]  # [G, G, U]
        delta = safe_div(jnp.sum(before, 1).astype(jnp.float32), jnp.sum(correct))
    return out._replace(delta=jnp.where(in_unit & live, delta, 0.0).astype(jnp.float32))


@OPERATORS.register("terminal")
def phi_terminal(units: jax.Array, n_units: jax.Array, correct: jax.Array, *,
                 alignment: str = "lcs", reduce: str = "max") -> Phi:
    """φ = 0 for every response: IBPO reduces to its base optimizer (DESIGN §2, Table 2a)."""
    del alignment, reduce
    g, n_slots = units.shape
    return Phi(phi=jnp.zeros((g,), jnp.float32), delta=jnp.zeros((g, n_slots), jnp.float32),
               first_error=jnp.where(correct, n_units, 0).astype(jnp.int32),
               best_match=jnp.full((g,), -1, jnp.int32))


@OPERATORS.register("lcs")
def phi_lcs(units: jax.Array, n_units: jax.Array, correct: jax.Array, *,
            alignment: str = "lcs", reduce: str = "max") -> Phi:
    """φ_i = reduce_j LCS(u_i, u_j) / n_i over correct j (DESIGN §2, paper §3.2); Δ uniform.
    first_error reports e_{i j*} under `alignment`."""
    lcs, e = _first_errors(units, n_units, alignment)
    out = _reduce(safe_div(lcs, n_units[:, None]), e, n_units, correct, reduce)
    return _with_delta(out, e, n_units, correct, units.shape[1], reduce, prefix_delta=False)


@OPERATORS.register("lcs_first_error")
def phi_lcs_first_error(units: jax.Array, n_units: jax.Array, correct: jax.Array, *,
                        alignment: str = "lcs", reduce: str = "max") -> Phi:
    """φ_i = reduce_j e_ij / n_i over correct j, e_ij the first error under `alignment`
    (DESIGN §2, Table 2a row 3); Δ_iu = [u < e_ij*] (max) or its mean over correct j (mean)."""
    _, e = _first_errors(units, n_units, alignment)
    out = _reduce(safe_div(e, n_units[:, None]), e, n_units, correct, reduce)
    return _with_delta(out, e, n_units, correct, units.shape[1], reduce, prefix_delta=True)


@OPERATORS.register("edit_distance")
def phi_edit_distance(units: jax.Array, n_units: jax.Array, correct: jax.Array, *,
                      alignment: str = "lcs", reduce: str = "max") -> Phi:
    """φ_i = reduce_j 1 - Lev(u_i, u_j) / max(n_i, n_j) over correct j (DESIGN §2, Table 2a
    row 2, no alignment step); Δ uniform. first_error reports e_{i j*} under `alignment`."""
    pairs = _group_pairs(units, n_units)
    g = units.shape[0]
    lev = _lev_pairs(*pairs).reshape(g, g)
    _, e = _first_errors(units, n_units, alignment)
    score = 1.0 - safe_div(lev, jnp.maximum(n_units[:, None], n_units[None, :]))
    out = _reduce(score, e, n_units, correct, reduce)
    return _with_delta(out, e, n_units, correct, units.shape[1], reduce, prefix_delta=False)


def compute_phi(units: jax.Array, n_units: jax.Array, correct: jax.Array, *,
                operator: str = "lcs_first_error", alignment: str = "lcs",
                reduce: str = "max") -> Phi:
    """φ, Δ, first errors and best matches of ONE group (DESIGN §2); vmap for a batch.

    units: [G, U] int32 unit ids (from `response_units`, `split_steps` or `token_units`; give
    every unit a slot, see the module docstring), n_units: [G] int32, correct: [G] bool.
    operator: a name in `registry.OPERATORS` ("terminal", "edit_distance", "lcs",
    "lcs_first_error"); alignment: "lcs" | "prefix" (the first-error rule); reduce: "max" |
    "mean" (over the group's correct responses). Under jax.vmap (units [B, G, U]) all B·G²
    pairs run in one kernel call.
    """
    fn = OPERATORS.get(operator, key="ibpo.operator")
    _choice(alignment, ALIGNMENTS, "ibpo.alignment")
    _choice(reduce, REDUCTIONS, "ibpo.reduce")
    units, n_units, correct = map(jnp.asarray, (units, n_units, correct))
    _check_group(units, n_units, correct)
    return fn(units.astype(jnp.int32), n_units.astype(jnp.int32), correct.astype(bool),
              alignment=alignment, reduce=reduce)
