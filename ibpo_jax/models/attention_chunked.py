"""Blockwise attention in plain XLA: memory linear in sequence length, forward and backward.

The forward loops over query blocks and, inside each, over the key blocks its causal window
reaches (online softmax); it keeps only the output and the per-row logsumexp. The custom VJP
recomputes each block's scores from those (the FlashAttention-2 backward), so neither pass
ever holds more than one [.., block_q, block_kv] tile of scores: O(T * block) memory, not
O(T * S). Key blocks past a query block's causal window are never visited (static bound),
nor key blocks before the first real key of the batch (left padding; a dynamic loop start).

Same contract as `attention.dense_attention` (the reference): q [B, K, G, T, H] pre-scaled,
k/v [B, K, S, H], a structural `attention.Mask`; a query row with no visible key gives 0 and
passes no gradient. Axis alphabet as in `attention`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array
NEG_INF = -1e30  # finite, so masked-row arithmetic never makes NaN


def pad_to(x: Array, axis: int, size: int) -> Array:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths)


def _tile_mask(q_seg: Array, kv_seg: Array, q0: Array, k0: Array, offset: int) -> Array:
    """The [B, 1, 1, bq, bk] visibility of one tile: query rows q0 + t, key columns k0 + s
    (q_seg [B, bq], kv_seg [B, bk] of the tile)."""
    bq, bk = q_seg.shape[1], kv_seg.shape[1]
    causal = (k0 + jnp.arange(bk))[None, :] <= (q0 + offset + jnp.arange(bq))[:, None]
    same = (q_seg[:, :, None] == kv_seg[:, None, :]) & (kv_seg[:, None, :] != 0)
    return (causal[None] & same)[:, None, None]


def _scores(q_i: Array, k_j: Array, allowed: Array) -> Array:
    s = jnp.einsum("BKGTH,BKSH->BKGTS", q_i, k_j, preferred_element_type=jnp.float32)
    return jnp.where(allowed, s, NEG_INF)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Static tiling of one call (hashable: a nondiff argument of the custom VJP)."""

    t: int
    s: int
    bq: int  # query block
    bk: int  # key block

    @classmethod
    def of(cls, t: int, s: int, block_q: int, block_kv: int) -> _Plan:
        return cls(t, s, min(block_q, t), min(block_kv, s))

    @property
    def nq(self) -> int:
        return -(-self.t // self.bq)

    @property
    def nk(self) -> int:
        return -(-self.s // self.bk)

    @property
    def tp(self) -> int:  # padded query length
        return self.nq * self.bq

    @property
    def sp(self) -> int:  # padded key length
        return self.nk * self.bk

    @property
    def offset(self) -> int:  # query t sits at key index t + offset
        return self.s - self.t

    def kv_end(self, i: Array) -> Array:
        """One past the last key block that query block i can see."""
        last_key = (i + 1) * self.bq - 1 + self.offset
        return jnp.minimum(self.nk, last_key // self.bk + 1)


def _first_kv_block(plan: _Plan, kv_seg: Array) -> Array:
    """The first key block holding a real key of any row (all blocks before are padding)."""
    real = jnp.any((kv_seg != 0).reshape(kv_seg.shape[0], plan.nk, plan.bk), axis=(0, 2))
    return jnp.argmax(real).astype(jnp.int32)  # 0 when none: then every tile is masked anyway


def _forward(plan: _Plan, q: Array, k: Array, v: Array, q_seg: Array, kv_seg: Array
             ) -> tuple[Array, Array]:
    """Padded inputs -> out [B, K, G, Tp, H] (q's dtype) and logsumexp [B, K, G, Tp] float32
    (+1e30 on rows with no visible key, so that their recomputed p is 0)."""
    b, kk, g, _, h = q.shape
    bq, bk = plan.bq, plan.bk
    start = _first_kv_block(plan, kv_seg)

    def q_block(i, outs):
        out, lse = outs
        q_i = jax.lax.dynamic_slice_in_dim(q, i * bq, bq, axis=3)
        qs_i = jax.lax.dynamic_slice_in_dim(q_seg, i * bq, bq, axis=1)

        def kv_block(j, carry):
            m, l, acc = carry
            k_j = jax.lax.dynamic_slice_in_dim(k, j * bk, bk, axis=2)
            v_j = jax.lax.dynamic_slice_in_dim(v, j * bk, bk, axis=2)
            ks_j = jax.lax.dynamic_slice_in_dim(kv_seg, j * bk, bk, axis=1)
            s = _scores(q_i, k_j, _tile_mask(qs_i, ks_j, i * bq, j * bk, plan.offset))
            m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
            p = jnp.exp(s - m_new)
            alpha = jnp.exp(m - m_new)
            pv = jnp.einsum("BKGTS,BKSH->BKGTH", p.astype(v.dtype), v_j,
                            preferred_element_type=jnp.float32)
            return m_new, alpha * l + jnp.sum(p, axis=-1, keepdims=True), alpha * acc + pv

        init = (jnp.full((b, kk, g, bq, 1), NEG_INF, jnp.float32),
                jnp.zeros((b, kk, g, bq, 1), jnp.float32),
                jnp.zeros((b, kk, g, bq, h), jnp.float32))
        m, l, acc = jax.lax.fori_loop(start, plan.kv_end(i), kv_block, init)
        # A row that never met a visible key still has m = NEG_INF (its masked scores are all
        # NEG_INF, so l counts them): it gets out 0 and lse +1e30.
        seen = m > NEG_INF / 2
        o_i = jnp.where(seen, acc / jnp.where(seen, l, 1.0), 0.0).astype(out.dtype)
        lse_i = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -NEG_INF)[..., 0]
        out = jax.lax.dynamic_update_slice_in_dim(out, o_i, i * bq, axis=3)
        lse = jax.lax.dynamic_update_slice_in_dim(lse, lse_i, i * bq, axis=3)
        return out, lse

    init = (jnp.zeros(q.shape, q.dtype), jnp.zeros(q.shape[:-1], jnp.float32))
    return jax.lax.fori_loop(0, plan.nq, q_block, init)


def _backward(plan: _Plan, q: Array, k: Array, v: Array, q_seg: Array, kv_seg: Array,
              out: Array, lse: Array, d_out: Array) -> tuple[Array, Array, Array]:
    """Padded inputs, forward results and the output cotangent -> dq, dk, dv (float32).
    Per tile: p = exp(s - lse), dv += p^T do, ds = p (do v^T - delta), dq += ds k,
    dk += ds^T q, with delta = rowsum(do * out)."""
    b, kk, g, _, h = q.shape
    bq, bk = plan.bq, plan.bk
    start = _first_kv_block(plan, kv_seg)
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)

    def q_block(i, grads):
        dq, dk, dv = grads
        q_i = jax.lax.dynamic_slice_in_dim(q, i * bq, bq, axis=3)
        qs_i = jax.lax.dynamic_slice_in_dim(q_seg, i * bq, bq, axis=1)
        do_i = jax.lax.dynamic_slice_in_dim(d_out, i * bq, bq, axis=3).astype(v.dtype)
        lse_i = jax.lax.dynamic_slice_in_dim(lse, i * bq, bq, axis=3)[..., None]
        delta_i = jax.lax.dynamic_slice_in_dim(delta, i * bq, bq, axis=3)[..., None]

        def kv_block(j, carry):
            dq_i, dk, dv = carry
            k_j = jax.lax.dynamic_slice_in_dim(k, j * bk, bk, axis=2)
            v_j = jax.lax.dynamic_slice_in_dim(v, j * bk, bk, axis=2)
            ks_j = jax.lax.dynamic_slice_in_dim(kv_seg, j * bk, bk, axis=1)
            p = jnp.exp(_scores(q_i, k_j, _tile_mask(qs_i, ks_j, i * bq, j * bk, plan.offset))
                        - lse_i)
            dv_j = jnp.einsum("BKGTS,BKGTH->BKSH", p.astype(v.dtype), do_i,
                              preferred_element_type=jnp.float32)
            dp = jnp.einsum("BKGTH,BKSH->BKGTS", do_i, v_j, preferred_element_type=jnp.float32)
            ds = (p * (dp - delta_i)).astype(q.dtype)
            dq_i = dq_i + jnp.einsum("BKGTS,BKSH->BKGTH", ds, k_j,
                                     preferred_element_type=jnp.float32)
            dk_j = jnp.einsum("BKGTS,BKGTH->BKSH", ds, q_i, preferred_element_type=jnp.float32)
            dk = jax.lax.dynamic_update_slice_in_dim(
                dk, jax.lax.dynamic_slice_in_dim(dk, j * bk, bk, axis=2) + dk_j, j * bk, axis=2)
            dv = jax.lax.dynamic_update_slice_in_dim(
                dv, jax.lax.dynamic_slice_in_dim(dv, j * bk, bk, axis=2) + dv_j, j * bk, axis=2)
            return dq_i, dk, dv

        dq_i = jnp.zeros((b, kk, g, bq, h), jnp.float32)
        dq_i, dk, dv = jax.lax.fori_loop(start, plan.kv_end(i), kv_block, (dq_i, dk, dv))
        return jax.lax.dynamic_update_slice_in_dim(dq, dq_i, i * bq, axis=3), dk, dv

    init = (jnp.zeros(q.shape, jnp.float32), jnp.zeros(k.shape, jnp.float32),
            jnp.zeros(v.shape, jnp.float32))
    return jax.lax.fori_loop(0, plan.nq, q_block, init)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(plan: _Plan, q: Array, k: Array, v: Array, q_seg: Array, kv_seg: Array) -> Array:
    return _forward(plan, q, k, v, q_seg, kv_seg)[0]


def _attend_fwd(plan, q, k, v, q_seg, kv_seg):
    out, lse = _forward(plan, q, k, v, q_seg, kv_seg)
    return out, (q, k, v, q_seg, kv_seg, out, lse)


def _attend_bwd(plan, res, d_out):
    q, k, v, q_seg, kv_seg, out, lse = res
    dq, dk, dv = _backward(plan, q, k, v, q_seg, kv_seg, out, lse, d_out)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def chunked_attention(q: Array, k: Array, v: Array, mask: Any, block_q: int = 512,
                      block_kv: int = 512) -> Array:
    """q [B, K, G, T, H] (pre-scaled), k/v [B, K, S, H], mask an `attention.Mask` ->
    [B, K, G, T, H] in q's dtype. T and S need not be multiples of the blocks: the inputs are
    padded with masked (segment 0) rows and keys, and the output sliced back."""
    t, s = q.shape[3], k.shape[2]
    plan = _Plan.of(t, s, block_q, block_kv)
    # Padded query rows get segment 0 (no visible key) and padded keys segment 0 (never
    # visible); causal indices of the real rows and keys are unchanged (padding at the end).
    q_seg = pad_to(mask.q_segment.astype(jnp.int32), 1, plan.tp)
    kv_seg = pad_to(mask.kv_segment.astype(jnp.int32), 1, plan.sp)
    out = _attend(plan, pad_to(q, 3, plan.tp), pad_to(k, 2, plan.sp), pad_to(v, 2, plan.sp),
                  q_seg, kv_seg)
    return out[:, :, :, :t]
