"""Counterfactual comparison operator φ and per-unit credit Δ (DESIGN §2, paper §3.2-§3.3).

A response is cut into units (reasoning steps, or tokens); each wrong response i of a group is
compared with every correct response j of the same group, and φ_i is its best closeness to a
correct solution. All functions are jittable and vmappable, take int32 arrays padded to static
lengths, and never look at padding: values beyond a length are arbitrary.

Pair kernels: `lcs_first_error` and `edit_distance` compare one pair; under `jax.vmap` (any
nesting) they route, through `jax.custom_batching.custom_vmap`, to one bit-parallel kernel call
over all pairs (`ibpo_jax._bitparallel`). `compute_phi` compares the G x G pairs of a group in one
such call, and a vmap over groups merges all groups' pairs into the same single call.

Step units (`split_steps`) are hashed on device to one int32 per step (see `_hash_steps` for the
collision rate). Ties in the max over j go to the lowest j.

Per-unit credit Δ (DESIGN §2): for `lcs_first_error`, 1 on the units before the first error of
the best match and 0 from it on (mean f/n = φ); for `lcs` and `edit_distance`, whose φ is not a
prefix length, Δ = φ on every unit, so that mean Δ = φ still holds and `credit="token"` reduces
to sequence credit.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from ibpo_jax import _bitparallel
from ibpo_jax.registry import OPERATORS

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


_lcs_pairs = _batched(_bitparallel.lcs_first_error_batch)
_lev_pairs = _batched(_bitparallel.levenshtein_batch)


def _one_pair(fn, a, b, a_len, b_len):
    a, b, a_len, b_len = map(jnp.asarray, (a, b, a_len, b_len))
    if a.ndim != 1 or b.ndim != 1 or a_len.ndim != 0 or b_len.ndim != 0:
        raise ValueError("comparison: expected a [La], b [Lb] and scalar lengths (use jax.vmap "
                         f"for batches), got shapes {a.shape}, {b.shape}, {a_len.shape}, "
                         f"{b_len.shape}")
    out = fn(a[None], b[None], a_len[None], b_len[None])
    return jax.tree.map(lambda y: y[0], out)


def lcs_first_error(a: jax.Array, b: jax.Array, a_len: jax.Array, b_len: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
    """LCS length and first-error position of a[:a_len] against b[:b_len], one DP pass.

    a: [La] int32, b: [Lb] int32, a_len, b_len: int32 scalars (clipped to [0, L]).
    Returns (lcs, first_error), int32 scalars, with first_error = max{k : LCS(a[:k], b) = k}:
    how many leading units of a appear, in order, in b (DESIGN §2, f_ij).
    """
    return _one_pair(_lcs_pairs, a, b, a_len, b_len)


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


def split_steps(tokens: jax.Array, length: jax.Array, is_delim: jax.Array, *,
                max_units: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Cuts a response into reasoning steps and hashes each step to one int32 id (DESIGN §2).

    tokens: [T] int32, length: int32 scalar (tokens[length:] are ignored), is_delim: [V] bool
    over the vocabulary. A step is a maximal run of non-delimiter tokens; delimiters only
    separate steps and are not hashed, empty runs vanish. Token ids outside [0, V) count as
    non-delimiters.
    Returns units [U] int32 (U = max_units or T; entries past n_units are 0) and n_units, an
    int32 scalar. Steps beyond max_units are dropped (n_units <= U).
    """
    tokens = jnp.asarray(tokens)
    n = tokens.shape[0]
    n_slots = n if max_units is None else int(max_units)
    if n_slots < 1:
        raise ValueError(f"split_steps: max_units must be >= 1, got {max_units}")
    word, _, step, start_pos = _step_structure(tokens, length, is_delim)
    n_steps = jnp.sum((word & (start_pos == jnp.arange(n))).astype(jnp.int32))
    n_units = jnp.minimum(n_steps, n_slots)
    h = _hash_steps(tokens, word, step, start_pos, n_slots)
    units = jnp.where(jnp.arange(n_slots) < n_units, jax.lax.bitcast_convert_type(h, jnp.int32), 0)
    return units, n_units


def token_unit_index(tokens: jax.Array, length: jax.Array, is_delim: jax.Array, *,
                     max_units: int | None = None) -> jax.Array:
    """The step each token belongs to, for handing every token its unit's Δ.

    Same arguments as `split_steps`. Returns [T] int32: a step token gets its step's index; a
    delimiter gets the step it terminates, i.e. the step before it (a run of delimiters all
    close the same step; delimiters before the first step get -1); tokens at or after
    `length` and tokens of steps dropped by max_units get -1.
    """
    tokens = jnp.asarray(tokens)
    n_slots = tokens.shape[0] if max_units is None else int(max_units)
    _, _, step, _ = _step_structure(tokens, length, is_delim)
    valid = jnp.arange(tokens.shape[0]) < length
    return jnp.where(valid & (step >= 0) & (step < n_slots), step, -1)


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
    (-1 = no unit) -> [..., T], 0 where token_unit == -1."""
    values, token_unit = jnp.asarray(values), jnp.asarray(token_unit)
    idx = jnp.clip(token_unit, 0, values.shape[-1] - 1)
    picked = jnp.take_along_axis(values, idx, axis=-1)
    return jnp.where(token_unit >= 0, picked, jnp.zeros((), values.dtype))


# ---------------------------------------------------------------------------------------------
# φ over one group


class Phi(NamedTuple):
    """Result of `compute_phi` for a group of G responses with U unit slots.

    phi: [G] float32 in [0, 1]; 0 for correct responses and when the group has no correct one.
    delta: [G, U] float32 per-unit credit; its mean over the first n_i units is exactly phi_i.
    first_error: [G] int32. Wrong non-empty i with a correct peer: f_{i j*}, the first-error
        position against the best match j* of the operator; correct i: n_i; any other wrong i
        (empty, or no correct response in the group): 0.
    best_match: [G] int32, j* (lowest index among ties); -1 for correct i, empty i and when the
        group has no correct response.
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
    la = jnp.repeat(n_units, g)
    lb = jnp.tile(n_units, g)
    return a, b, la, lb


def _check_group(units, n_units, correct) -> None:
    if units.ndim != 2:
        raise ValueError(f"compute_phi: units must be [G, U] for one group (vmap over groups), "
                         f"got shape {units.shape}")
    if n_units.shape != units.shape[:1] or correct.shape != units.shape[:1]:
        raise ValueError(f"compute_phi: n_units and correct must be [G] = {units.shape[:1]}, got "
                         f"{n_units.shape} and {correct.shape}")


def _finish(score, f, n_units, correct) -> Phi:
    """Max over correct j of score [G, G] -> Phi (delta filled in by `_with_delta`).
    f: first-error positions [G, G]."""
    g = score.shape[0]
    any_correct = jnp.any(correct)
    masked = jnp.where(correct[None, :], score, -jnp.inf)
    best = jnp.argmax(masked, axis=1).astype(jnp.int32)  # lowest j among ties
    has_match = ~correct & any_correct & (n_units > 0)
    phi = jnp.where(has_match, jnp.take_along_axis(score, best[:, None], 1)[:, 0], 0.0)
    phi = phi.astype(jnp.float32)
    f_best = jnp.take_along_axis(f, best[:, None], 1)[:, 0]
    first_error = jnp.where(correct, n_units, jnp.where(has_match, f_best, 0)).astype(jnp.int32)
    return Phi(phi=phi, delta=jnp.zeros((g, 0), jnp.float32), first_error=first_error,
               best_match=jnp.where(has_match, best, -1))


def _safe_div(x, d):
    return x / jnp.maximum(d, 1).astype(jnp.float32)


def _with_delta(phi: Phi, n_slots: int, n_units, *, first_error_delta: bool) -> Phi:
    slot = jnp.arange(n_slots)[None, :]
    in_unit = slot < n_units[:, None]
    if first_error_delta:
        # Δ_iu = 1 before the first error of the best match, 0 from it on (mean = f / n = φ)
        delta = (slot < phi.first_error[:, None]) & in_unit & (phi.phi[:, None] > 0)
        delta = delta.astype(jnp.float32)
    else:
        # `lcs` / `edit_distance`: φ is not a prefix length, so a prefix indicator would not
        # average to φ; the credit is spread uniformly (mean Δ = φ, token credit = sequence).
        delta = jnp.where(in_unit, phi.phi[:, None], 0.0)
    return phi._replace(delta=delta)


@OPERATORS.register("terminal")
def phi_terminal(units: jax.Array, n_units: jax.Array, correct: jax.Array) -> Phi:
    """φ = 0 for every response: IBPO reduces to its base optimizer (DESIGN §2, Table 2a)."""
    _check_group(units, n_units, correct)
    g, n_slots = units.shape
    return Phi(phi=jnp.zeros((g,), jnp.float32), delta=jnp.zeros((g, n_slots), jnp.float32),
               first_error=jnp.where(correct, n_units, 0).astype(jnp.int32),
               best_match=jnp.full((g,), -1, jnp.int32))


@OPERATORS.register("lcs")
def phi_lcs(units: jax.Array, n_units: jax.Array, correct: jax.Array) -> Phi:
    """φ_i = max_j LCS(u_i, u_j) / n_i over correct j (DESIGN §2, paper §3.2); Δ uniform."""
    _check_group(units, n_units, correct)
    lcs, f = jax.vmap(lcs_first_error)(*_group_pairs(units, n_units))
    g = units.shape[0]
    score = _safe_div(lcs.reshape(g, g), n_units[:, None])
    out = _finish(score, f.reshape(g, g), n_units, correct)
    return _with_delta(out, units.shape[1], n_units, first_error_delta=False)


@OPERATORS.register("lcs_first_error")
def phi_lcs_first_error(units: jax.Array, n_units: jax.Array, correct: jax.Array) -> Phi:
    """φ_i = max_j f_ij / n_i over correct j, f_ij the first-error position (DESIGN §2,
    Table 2a row 3); Δ_iu = 1 for units before f_ij*, 0 from the first error on."""
    _check_group(units, n_units, correct)
    _, f = jax.vmap(lcs_first_error)(*_group_pairs(units, n_units))
    g = units.shape[0]
    f = f.reshape(g, g)
    out = _finish(_safe_div(f, n_units[:, None]), f, n_units, correct)
    return _with_delta(out, units.shape[1], n_units, first_error_delta=True)


@OPERATORS.register("edit_distance")
def phi_edit_distance(units: jax.Array, n_units: jax.Array, correct: jax.Array) -> Phi:
    """φ_i = max_j 1 - Lev(u_i, u_j) / max(n_i, n_j) over correct j (DESIGN §2, Table 2a
    row 2, no alignment step); Δ uniform. first_error still reports f_{i j*}."""
    _check_group(units, n_units, correct)
    pairs = _group_pairs(units, n_units)
    lev = jax.vmap(edit_distance)(*pairs)
    _, f = jax.vmap(lcs_first_error)(*pairs)
    g = units.shape[0]
    longest = jnp.maximum(n_units[:, None], n_units[None, :])
    score = 1.0 - _safe_div(lev.reshape(g, g), longest)
    out = _finish(score, f.reshape(g, g), n_units, correct)
    return _with_delta(out, units.shape[1], n_units, first_error_delta=False)


def compute_phi(units: jax.Array, n_units: jax.Array, correct: jax.Array, *,
                operator: str = "lcs_first_error") -> Phi:
    """φ, Δ, first errors and best matches of ONE group (DESIGN §2); vmap for a batch.

    units: [G, U] int32 unit ids (from `split_steps` or `token_units`), n_units: [G] int32,
    correct: [G] bool. operator: a name in `registry.OPERATORS` ("terminal", "edit_distance",
    "lcs", "lcs_first_error"). Under jax.vmap (units [B, G, U]) all B·G² pairs run in one
    kernel call.
    """
    fn = OPERATORS.get(operator, key="comparison.operator")
    units, n_units, correct = map(jnp.asarray, (units, n_units, correct))
    return fn(units.astype(jnp.int32), n_units.astype(jnp.int32), correct.astype(bool))
