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
over all pairs (`core._bitparallel`). `compute_phi` compares the G x G pairs of a group in one
such call, and a vmap over groups merges all groups' pairs into the same single call.

Units (steps hashed to ids, or tokens) and the unit budget: `ibpo_jax.core.units`, whose public
names are re-exported here.

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

from ibpo_jax.config.registry import OPERATORS
from ibpo_jax.core import _bitparallel
from ibpo_jax.core.numerics import safe_div
from ibpo_jax.core.units import (  # noqa: F401  (units re-exported: the comparison's input API)
    GRANULARITIES,
    Units,
    response_units,
    split_steps,
    token_unit_index,
    token_units,
    units_to_tokens,
)

ALIGNMENTS = ("lcs", "prefix")
REDUCTIONS = ("max", "mean")

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
# Per-token credit


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


def _prefix_phi(e: jax.Array, n_units: jax.Array, correct: jax.Array, n_slots: int) -> Phi:
    """Phi of first errors e [G] read without a peer (`checker`, `peer_steps`): normalized,
    capped and credited exactly as `lcs_first_error`'s under reduce="max" (φ_i = e_i / n_i and
    Δ_iu = [u < e_i] on the wrong non-empty responses of a group with a correct one)."""
    e = jnp.clip(e, 0, n_units)
    has_match = ~correct & jnp.any(correct) & (n_units > 0)
    phi = jnp.where(has_match, safe_div(e, n_units), 0.0).astype(jnp.float32)
    slot = jnp.arange(n_slots)[None, :]
    delta = (slot < e[:, None]) & (slot < n_units[:, None]) & (phi > 0)[:, None]
    return Phi(phi=phi, delta=delta.astype(jnp.float32),
               first_error=jnp.where(correct, n_units, jnp.where(has_match, e, 0)).astype(
                   jnp.int32),
               best_match=jnp.full(e.shape, -1, jnp.int32))


@OPERATORS.register("checker")
def phi_checker(units: jax.Array, n_units: jax.Array, correct: jax.Array, *,
                alignment: str = "lcs", reduce: str = "max", truth: jax.Array | None = None
                ) -> Phi:
    """Oracle credit (issue 57): e_i = the task checker's first wrong step of response i,
    given in the units' own index (`truth` [G] int32; < 0: the checker names no wrong unit,
    so every unit present is right and e_i = n_i); φ and Δ as `lcs_first_error`'s
    (`_prefix_phi`). No peer is read (best_match -1): the same responses get credit as under
    the LCS operators, only where their first error lies differs."""
    del alignment, reduce
    if truth is None:
        raise ValueError("comparison: ibpo.operator='checker' needs the checker's first wrong "
                         "step of every response (truth)")
    truth = jnp.asarray(truth, jnp.int32)
    return _prefix_phi(jnp.where(truth >= 0, truth, n_units), n_units, correct, units.shape[1])


def peer_first_errors(units: jax.Array, n_units: jax.Array, correct: jax.Array) -> jax.Array:
    """[G] int32: the first unit of each u_i that NO correct response of the group contains,
    anywhere (n_i when every unit is some correct peer's). units [G, U], n_units [G], correct
    [G]. Cost: one sort of the group's G·U units and G·U binary searches."""
    g, n_slots = units.shape
    slot = jnp.arange(n_slots)[None, :]
    in_unit = slot < n_units[:, None]  # [G, U]
    peer = (correct[:, None] & in_unit).reshape(-1)
    flat = units.reshape(-1)
    # Peers' units sorted first among equal values, the others pushed to the end: the array is
    # sorted, and the leftmost slot holding a query value is a peer's if any peer has it.
    key = jnp.where(peer, flat, jnp.iinfo(jnp.int32).max)
    order = jnp.lexsort((~peer, key))
    keys, is_peer = key[order], peer[order]
    at = jnp.clip(jnp.searchsorted(keys, flat, side="left"), 0, flat.shape[0] - 1)
    taken = ((keys[at] == flat) & is_peer[at]).reshape(g, n_slots)
    miss = in_unit & ~taken
    return jnp.where(jnp.any(miss, 1), jnp.argmax(miss, 1), n_units).astype(jnp.int32)


@OPERATORS.register("peer_steps")
def phi_peer_steps(units: jax.Array, n_units: jax.Array, correct: jax.Array, *,
                   alignment: str = "lcs", reduce: str = "max") -> Phi:
    """e_i = the first unit of u_i that no correct response of the group contains, anywhere
    (issue 57, `peer_first_errors`): a step counts as right when any correct peer took it, in
    any order, so a wrong response that took a right path of its own up to its mistake is not
    cut at the first step where it leaves one peer's sequence (LCS). With a task's canonical
    step ids (`Task.canonical_step`: e.g. countdown's commutative operands sorted) equal steps
    written differently match too. φ and Δ as `lcs_first_error`'s (`_prefix_phi`); no single
    peer is read (best_match -1), so `alignment` and `reduce` do not apply."""
    del alignment, reduce
    return _prefix_phi(peer_first_errors(units, n_units, correct), n_units, correct,
                       units.shape[1])


@OPERATORS.register("vouched_steps")
def phi_vouched_steps(units: jax.Array, n_units: jax.Array, correct: jax.Array, *,
                      alignment: str = "lcs", reduce: str = "max",
                      vouched: jax.Array | None = None) -> Phi:
    """e_i = the first step of u_i that nothing vouches for (issue 57): max(`peer_first_errors`,
    v_i), v_i [G] int32 = where the policy's continuations stop vouching, walking on from the
    peers' first error (one past the last of the consecutive step prefixes from which one of
    the sampled continuations was judged right; 0: none, `trainer.vouch`). Both signals only
    ever show a step right, never wrong, so the later is kept. φ and Δ as
    `lcs_first_error`'s (`_prefix_phi`); no single peer is read (best_match -1)."""
    del alignment, reduce
    if vouched is None:
        raise ValueError("comparison: ibpo.operator='vouched_steps' needs each response's "
                         "completion-vouched step count (vouched)")
    e = jnp.maximum(peer_first_errors(units, n_units, correct), jnp.asarray(vouched, jnp.int32))
    return _prefix_phi(e, n_units, correct, units.shape[1])


# Operators that read the checker's first wrong step (`compute_phi(truth=...)`), the policy's
# completions (`compute_phi(vouched=...)`), and the task's canonical step ids when it has them.
NEEDS_TRUTH = ("checker",)
NEEDS_VOUCHED = ("vouched_steps",)
CANONICAL = ("peer_steps", "vouched_steps")


def compute_phi(units: jax.Array, n_units: jax.Array, correct: jax.Array, *,
                operator: str = "lcs_first_error", alignment: str = "lcs",
                reduce: str = "max", truth: jax.Array | None = None,
                vouched: jax.Array | None = None) -> Phi:
    """φ, Δ, first errors and best matches of ONE group (DESIGN §2); vmap for a batch.

    units: [G, U] int32 unit ids (from `response_units`, `split_steps` or `token_units`; give
    every unit a slot, see the module docstring), n_units: [G] int32, correct: [G] bool.
    operator: a name in `registry.OPERATORS` ("terminal", "edit_distance", "lcs",
    "lcs_first_error", "peer_steps", "vouched_steps", "checker"); alignment: "lcs" | "prefix"
    (the first-error rule); reduce: "max" | "mean" (over the group's correct responses); truth:
    [G] int32, the checker's first wrong unit of each response (< 0: none), read by "checker"
    alone; vouched: [G] int32, the units a right completion vouches for, read by
    "vouched_steps" alone. Under
    jax.vmap (units [B, G, U]) all B·G² pairs run in one kernel call.
    """
    fn = OPERATORS.get(operator, key="ibpo.operator")
    _choice(alignment, ALIGNMENTS, "ibpo.alignment")
    _choice(reduce, REDUCTIONS, "ibpo.reduce")
    units, n_units, correct = map(jnp.asarray, (units, n_units, correct))
    _check_group(units, n_units, correct)
    kw = ({"truth": truth} if operator in NEEDS_TRUTH
          else {"vouched": vouched} if operator in NEEDS_VOUCHED else {})
    return fn(units.astype(jnp.int32), n_units.astype(jnp.int32), correct.astype(bool),
              alignment=alignment, reduce=reduce, **kw)
