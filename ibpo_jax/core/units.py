"""Comparison units of responses (DESIGN §1-§2): reasoning steps hashed to one int32 id each,
or the tokens themselves, and each token's unit (for handing tokens their unit's credit).

Unit budget: by default every unit of a response has a slot (token units: the response width;
steps: (T + 1) // 2, the most steps T tokens can hold), so no budget changes φ. A smaller
`max_units` (memory) covers only the first units: `response_units` flags such rows
(`truncated`), their uncovered tail is left out of φ's denominator and out of Δ (its tokens get
the sequence credit φ_i, see `comparison.token_delta`). A cap can still move φ of a row that
fits it through a truncated correct peer (its dropped units can no longer be matched): only
the default budget makes φ exact; log the truncated fraction whenever a cap is set.

Step units (`split_steps`) are hashed on device to one int32 per step (see `_hash_steps` for the
collision rate).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

GRANULARITIES = ("step", "token")

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


def step_budget(n_tokens: int, max_units: int | None, where: str) -> int:
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
    n_slots = step_budget(tokens.shape[0], max_units, "split_steps")
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
    n_slots = step_budget(tokens.shape[0], max_units, "token_unit_index")
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
    if granularity not in GRANULARITIES:
        raise ValueError(f"comparison: unknown ibpo.granularity {granularity!r} (config key "
                         f"ibpo.granularity); valid: {', '.join(GRANULARITIES)}")
    length = (jnp.asarray(response_len) - jnp.asarray(ended).astype(jnp.int32)).astype(jnp.int32)
    width = tokens.shape[1]
    if granularity == "token":
        n_slots = width if max_units is None else step_budget(width, max_units, "response_units")
        return _token_granularity(tokens, jnp.maximum(length, 0), n_slots)
    if is_delim is None:
        raise ValueError("response_units: granularity='step' needs the tokenizer's is_delim table")
    n_slots = step_budget(width, max_units, "response_units")
    units, n_units, n_steps = jax.vmap(lambda t, n: _split(t, n, is_delim, n_slots))(tokens, length)
    token_unit = jax.vmap(lambda t, n: token_unit_index(t, n, is_delim, max_units=n_slots))(
        tokens, length)
    return Units(units, n_units, token_unit, n_steps > n_units)
