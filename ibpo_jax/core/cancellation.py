"""Token gradient cancellation: diagnostics and weight transforms (DESIGN §5).

A group's policy gradient is Σ_i Σ_t A_it w_it ∇logπ(y_it | x, y_i<t), with w from
`losses.token_weights`. Responses i, j share the node at position t of the group's prefix trie iff
tokens[i, :t+1] == tokens[j, :t+1] and both are valid there; all members of a node put their
gradient on the same (context, token), so what reaches that token is Σ_{members} A_jt w_jt.

Shapes: one group is tokens / mask / weights [G, T] (G responses, T positions), adv [G, T] or [G]
(broadcast). Everything is jittable; vmap over a batch of groups [B, G, T]. Node membership is a
[G, G, T] boolean built from prefix equality (cumulative product of token equality over t), so the
cost is O(G² T). Response arrays must be left-aligned (mask a prefix of each row), as the policy
loss uses them. Each node is counted once, at its representative: its lowest-index member.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ibpo_jax.config.registry import TRANSFORMS
from ibpo_jax.core.losses import LossSpec, Stat, coefficients, kl_penalty, safe_div, token_adv

# Document-frequency buckets of the context-free residual (see `bucketed_residual_terms`).
DEFAULT_BUCKET_EDGES = (0.25, 0.5, 0.75, 1.0)


class Nodes(NamedTuple):
    """Prefix-trie nodes of one group, indexed by (member i, position t)."""

    share: jax.Array  # [G, G, T] bool: i and j are on the same node at t (share[i, i, t] = valid)
    count: jax.Array  # [G, T] int32: members of (i, t)'s node; 0 on padding
    rep: jax.Array  # [G, T] bool: i is the lowest-index member of its node at t
    whole: jax.Array  # [G, T] bool: the node holds all valid responses of the group (>= 2)


def prefix_nodes(tokens: jax.Array, mask: jax.Array) -> Nodes:
    """Node membership of one group from prefix equality. tokens, mask: [G, T]."""
    if tokens.ndim != 2 or jnp.shape(mask) != tokens.shape:
        raise ValueError(f"tokens {tokens.shape} and mask {jnp.shape(mask)} must both be [G, T]")
    valid = jnp.asarray(mask).astype(bool)
    g = tokens.shape[0]
    eq = (tokens[:, None, :] == tokens[None, :, :]) & valid[:, None, :] & valid[None, :, :]
    share = jnp.cumprod(eq.astype(jnp.int32), axis=-1).astype(bool)
    count = jnp.sum(share, axis=1, dtype=jnp.int32)
    lower = jnp.arange(g)[None, :] < jnp.arange(g)[:, None]  # [i, j]: j < i
    rep = valid & ~jnp.any(share & lower[:, :, None], axis=1)
    n_valid = jnp.sum(jnp.any(valid, axis=-1), dtype=jnp.int32)
    whole = valid & (count == n_valid) & (n_valid >= 2)
    return Nodes(share, count, rep, whole)


def _group_inputs(tokens, mask, adv, weights):
    tokens = jnp.asarray(tokens)
    valid = jnp.asarray(mask).astype(bool)
    adv = jnp.asarray(adv, jnp.float32)
    weights = jnp.asarray(weights, jnp.float32)
    if weights.shape != tokens.shape:
        raise ValueError(f"weights {weights.shape} must have tokens' shape {tokens.shape}")
    if adv.shape not in (tokens.shape, tokens.shape[:1]):
        raise ValueError(f"adv {adv.shape} must be [G] or [G, T] for tokens {tokens.shape}")
    if adv.ndim == 1:
        adv = jnp.broadcast_to(adv[:, None], tokens.shape)
    return tokens, valid, jnp.where(valid, adv, 0.0), jnp.where(valid, weights, 0.0)


def node_sum(share: jax.Array, x: jax.Array) -> jax.Array:
    """[G, T]: Σ_j over (i, t)'s node members of x[j, t] (share: `Nodes.share` [G, G, T], x:
    [G, T]), e.g. a node's net update weight Σ_j A_jt w_jt, or how many of its members are
    correct. An elementwise sum, not a matmul, so accelerators do not round it to bf16."""
    return jnp.sum(jnp.where(share, x[None, :, :], 0.0), axis=1)


def _node_residuals(share, adv, weights):
    """Per (i, t): |Σ A w - w̄ Σ A| and Σ |A w| over (i, t)'s node."""
    count = jnp.sum(share, axis=1)
    s_aw = node_sum(share, adv * weights)
    w_bar = node_sum(share, weights) / jnp.maximum(count, 1)
    return jnp.abs(s_aw - w_bar * node_sum(share, adv)), node_sum(share, jnp.abs(adv * weights))


def residual_terms(
    tokens: jax.Array,
    mask: jax.Array,
    adv: jax.Array,
    weights: jax.Array,
    *,
    whole_group_only: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """(num, den) of the cancellation residual of one group (DESIGN §5).

    num = Σ_nodes |Σ_{i∈node} A_i w_i - w̄_node Σ_{i∈node} A_i|, den = Σ_nodes Σ_{i∈node} |A_i w_i|,
    over the nodes passed by >= 2 responses (or, with whole_group_only, by every valid response
    of the group). w̄_node is the mean weight of the node's members. Equal weights on every node
    (exchangeability) give num = 0, but not conversely: unequal weights can still give
    Σ A w = w̄ Σ A (A = [1, 1], w = [1, 2] is a node with num = 0), so a zero residual is
    necessary evidence, not proof. The credit a partly shared node legitimately carries,
    w̄ Σ A, is not counted. Sum num and den over groups for a batch value.

    Args:
      tokens: [G, T] int; mask: [G, T]; adv: [G, T] or [G]; weights: [G, T] (w_it).
    Returns:
      (num, den) float32 scalars.
    """
    tokens, valid, adv, weights = _group_inputs(tokens, mask, adv, weights)
    nodes = prefix_nodes(tokens, valid)
    resid, mass = _node_residuals(nodes.share, adv, weights)
    keep = nodes.rep & (nodes.whole if whole_group_only else nodes.count >= 2)
    return jnp.sum(jnp.where(keep, resid, 0.0)), jnp.sum(jnp.where(keep, mass, 0.0))


def cancellation_residual(
    tokens: jax.Array,
    mask: jax.Array,
    adv: jax.Array,
    weights: jax.Array,
    *,
    whole_group_only: bool = False,
) -> jax.Array:
    """Cancellation residual num / den of `residual_terms` (a scalar; 0 when den = 0). Not bounded
    by 1: a node whose members with nonzero A have w = 0 has num > 0 and no mass."""
    return safe_div(*residual_terms(tokens, mask, adv, weights, whole_group_only=whole_group_only))


def bucketed_residual_terms(
    tokens: jax.Array,
    mask: jax.Array,
    adv: jax.Array,
    weights: jax.Array,
    *,
    edges: Sequence[float] = DEFAULT_BUCKET_EDGES,
) -> tuple[jax.Array, jax.Array]:
    """Context-free residual of one group, per token-frequency bucket (DESIGN §5).

    Ignores context: the "node" of a token id is every valid occurrence of that id in the group
    (repeats inside one response included), as all of them update that id's unembedding row. An
    id is shared if it occurs in >= 2 responses. Its frequency is its document frequency
    f = (#responses containing it) / (#valid responses) ∈ (0, 1]; bucket k holds the shared ids
    with edges[k-1] < f <= edges[k] (the first bucket's lower edge is 0). With the default
    quartile edges and G = 8, the last bucket is the ids in 7 or 8 responses (template and
    formatting tokens, the analogue of whole-group nodes), the first one the ids in exactly 2.

    Per bucket, num = Σ_ids |Σ_occ A w - w̄_id Σ_occ A| and den = Σ_ids Σ_occ |A w|. Computed with
    one sort of the G·T occurrences, O(GT log GT), no vocabulary-sized array.

    Args:
      tokens, mask, adv, weights: as in `residual_terms`.
      edges: K increasing bucket upper edges in (0, 1], the last one 1.0 (static).
    Returns:
      (num [K], den [K]) float32.
    """
    edges = tuple(float(e) for e in edges)
    if not edges or edges[-1] != 1.0 or edges[0] <= 0 or any(
            b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise ValueError(f"edges must increase within (0, 1] and end at 1.0; got {edges}")
    tokens, valid, adv, weights = _group_inputs(tokens, mask, adv, weights)
    g, t = tokens.shape
    flat = lambda x: x.reshape(-1)  # noqa: E731
    resp = jnp.repeat(jnp.arange(g), t)
    # Valid occurrences first, then by id, then by response (lexsort: last key is primary).
    order = jnp.lexsort((resp, flat(tokens), (~flat(valid)).astype(jnp.int32)))
    ids, resp, ok = flat(tokens)[order], resp[order], flat(valid)[order]
    aw, a, w = flat(adv * weights)[order], flat(adv)[order], flat(weights)[order]
    first = jnp.ones((1,), bool)
    new_id = jnp.concatenate([first, (ids[1:] != ids[:-1]) | (ok[1:] != ok[:-1])])
    new_pair = new_id | jnp.concatenate([first, resp[1:] != resp[:-1]])
    seg = jnp.cumsum(new_id) - 1  # one segment per (validity, id)
    seg_sum = lambda x: jax.ops.segment_sum(x, seg, num_segments=g * t)  # noqa: E731
    okf = ok.astype(jnp.float32)
    df = seg_sum((new_pair & ok).astype(jnp.float32))
    n_occ = seg_sum(okf)
    s_aw, s_a, s_w = seg_sum(aw * okf), seg_sum(a * okf), seg_sum(w * okf)
    resid = jnp.abs(s_aw - s_w / jnp.maximum(n_occ, 1.0) * s_a)
    mass = seg_sum(jnp.abs(aw) * okf)
    n_valid = jnp.sum(jnp.any(valid, axis=-1)).astype(jnp.float32)
    frac = df / jnp.maximum(n_valid, 1.0)
    bucket = jnp.searchsorted(jnp.asarray(edges, jnp.float32), frac, side="left")
    bucket = jnp.where(df >= 2, bucket, len(edges))  # unshared ids and empty segments: dropped
    k = len(edges)
    num = jax.ops.segment_sum(resid, bucket, num_segments=k + 1)[:k]
    den = jax.ops.segment_sum(mass, bucket, num_segments=k + 1)[:k]
    return num, den


def bucketed_residual(
    tokens: jax.Array,
    mask: jax.Array,
    adv: jax.Array,
    weights: jax.Array,
    *,
    edges: Sequence[float] = DEFAULT_BUCKET_EDGES,
) -> jax.Array:
    """Per-bucket context-free residual [K] (num / den of `bucketed_residual_terms`, 0 if empty)."""
    return safe_div(*bucketed_residual_terms(tokens, mask, adv, weights, edges=edges))


def shared_logprob_drift(
    tokens: jax.Array,
    mask: jax.Array,
    logp_before: jax.Array,
    logp_after: jax.Array,
    *,
    whole_group_only: bool = False,
) -> Stat:
    """Mean change of log π on shared nodes across an update (DESIGN §5 "solution probability
    drift"): Stat(Σ_nodes (logp_after - logp_before) at the node, #nodes), one term per node
    (all members score the same context and token). tokens, mask, logp_*: [G, T]."""
    tokens = jnp.asarray(tokens)
    nodes = prefix_nodes(tokens, mask)
    keep = nodes.rep & (nodes.whole if whole_group_only else nodes.count >= 2)
    diff = jnp.asarray(logp_after, jnp.float32) - jnp.asarray(logp_before, jnp.float32)
    return Stat(jnp.sum(jnp.where(keep, diff, 0.0)), jnp.sum(keep).astype(jnp.float32))


# --------------------------------------------------------------------------- transforms


@TRANSFORMS.register("none")
def no_transform(
    tokens: jax.Array, mask: jax.Array, adv: jax.Array, weights: jax.Array
) -> jax.Array:
    """Weights unchanged (0 on padding)."""
    return _group_inputs(tokens, mask, adv, weights)[3]


@TRANSFORMS.register("min_replace")
def min_replace(
    tokens: jax.Array, mask: jax.Array, adv: jax.Array, weights: jax.Array
) -> jax.Array:
    """Every member of a shared node gets min_j w_j over the node's members: exchangeable weights,
    hence residual 0, never increasing any weight (no step grows past what the loss allowed)."""
    tokens, valid, _, weights = _group_inputs(tokens, mask, adv, weights)
    share = prefix_nodes(tokens, valid).share
    node_min = jnp.min(jnp.where(share, weights[None, :, :], jnp.inf), axis=1)
    return jnp.where(valid, node_min, 0.0)  # a valid (i, t) is its own member: finite


@TRANSFORMS.register("adv_orthogonal")
def adv_orthogonal(
    tokens: jax.Array, mask: jax.Array, adv: jax.Array, weights: jax.Array
) -> jax.Array:
    """On nodes shared by the whole group, w ← w - (Aᵀw / ‖A‖²) A over the members, so their net
    gradient Σ A w' is exactly 0 (up to rounding); nodes with ‖A‖ = 0 and all other positions
    keep their weights. A transformed weight can be negative."""
    tokens, valid, adv, weights = _group_inputs(tokens, mask, adv, weights)
    nodes = prefix_nodes(tokens, valid)
    a_dot_w = node_sum(nodes.share, adv * weights)
    a_sq = node_sum(nodes.share, adv * adv)
    change = nodes.whole & (a_sq > 0)
    coef = jnp.where(change, a_dot_w / jnp.where(change, a_sq, 1.0), 0.0)
    return weights - coef * adv


def apply_transform(
    tokens: jax.Array,
    mask: jax.Array,
    adv: jax.Array,
    weights: jax.Array,
    *,
    transform: str,
) -> jax.Array:
    """Transformed, stop-gradient weights w' [G, T] of one group (`cancellation.transform`)."""
    fn = TRANSFORMS.get(transform, key="cancellation.transform")
    return jax.lax.stop_gradient(fn(tokens, mask, adv, weights))


def reweighted_loss(
    spec: LossSpec,
    *,
    logp: jax.Array,
    adv: jax.Array,
    weights: jax.Array,
    mask: jax.Array,
    ref_logp: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Surrogate whose gradient is the transformed policy gradient, plus the KL term.

    num = -Σ_it sg(w'_it) A_it logp_it + β·KL numerator, den = the aggregation's den, so
    ∂(num/den)/∂logp_it = -A_it w'_it / den: with w' = `token_weights(...)` this reproduces the
    loss's policy gradient (the weights already hold the aggregation coefficients, so only den is
    taken from `spec.aggregation`). The value of the surrogate part is not the loss; log the loss's
    own metrics.

    Args:
      logp: [B, T] (carries gradient); adv: [B] or [B, T]; weights: [B, T] w' (any batch of
      groups flattened to rows); mask: [B, T]; ref_logp: [B, T] when spec.beta != 0.
      spec: the loss hyperparameters (aggregation, KL), as for the policy losses.
    Returns:
      (num, den) float32 scalars.
    """
    logp = jnp.asarray(logp, jnp.float32)
    adv = jnp.asarray(adv, jnp.float32)
    if logp.ndim != 2 or jnp.shape(weights) != logp.shape or jnp.shape(mask) != logp.shape:
        raise ValueError(f"logp {logp.shape}, weights {jnp.shape(weights)} and mask "
                         f"{jnp.shape(mask)} must all be the same [B, T]")
    if adv.shape not in (logp.shape, logp.shape[:1]):
        raise ValueError(f"adv {adv.shape} must be [B] or [B, T] for logp {logp.shape}")
    valid = jnp.asarray(mask).astype(bool)
    logp = jnp.where(valid, logp, 0.0)  # padding may hold -inf / NaN
    w = jax.lax.stop_gradient(jnp.where(valid, jnp.asarray(weights, jnp.float32), 0.0))
    pg_num = -jnp.sum(w * token_adv(adv, valid) * logp)
    _, den = coefficients(spec, valid)
    kl_num, _ = kl_penalty(spec, logp=logp, ref_logp=ref_logp, mask=valid)
    return pg_num + kl_num, den
