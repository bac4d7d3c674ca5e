"""Attention kernels for Qwen3 (pure functions, float32 softmax).

`self_attention` serves training, scoring and prefill; its hand-written VJP (the
FlashAttention backward algebra, materialized) saves one pass over the [.., T, S] scores and the
softmax division, which on CPU is most of attention's cost. `decode_attention` serves one new
token per row against the two-part KV cache (shared prompt part + per-row generated part).

Einsum axis alphabet: B batch, K key/value heads, G query heads per key/value head, Q = G*T
query rows of one key/value head, T query positions, S key positions / cache slots, H head_dim,
R samples per prompt.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30  # finite: a row with every key masked gets a uniform softmax, never NaN
Array = jax.Array


def mask_bias(allowed: Array) -> Array:
    """bool [..., T, S] (True = may attend) -> additive float32 bias (0 or NEG_INF)."""
    return jnp.where(allowed, 0.0, NEG_INF).astype(jnp.float32)


def _forward(q: Array, k: Array, v: Array, bias: Array) -> tuple[Array, Array, Array]:
    """q [B, K, Q, H] (pre-scaled), k/v [B, K, S, H], bias [B, 1, Q, S] -> out [B, K, Q, H]
    float32, exp(scores - rowmax) [B, K, Q, S] float32, row sums [B, K, Q, 1]."""
    s = jnp.einsum("BKQH,BKSH->BKQS", q, k, preferred_element_type=jnp.float32) + bias
    e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
    total = jnp.sum(e, axis=-1, keepdims=True)
    out = jnp.einsum("BKQS,BKSH->BKQH", e.astype(v.dtype), v,
                     preferred_element_type=jnp.float32) / total
    return out, e, total


@jax.custom_vjp
def _attend(q: Array, k: Array, v: Array, bias: Array) -> Array:
    return _forward(q, k, v, bias)[0].astype(q.dtype)


def _attend_fwd(q, k, v, bias):
    out, e, total = _forward(q, k, v, bias)
    out = out.astype(q.dtype)
    # Only whether a whole row is masked is kept for the backward, not the [.., Q, S] bias:
    # inside a row with some allowed key, masked entries already have p = 0 exactly.
    row_masked = jnp.max(bias, axis=-1, keepdims=True) < NEG_INF / 2  # [B, 1, Q, 1]
    return out, (q, k, v, row_masked, out, e, total)


def _transposed(x: Array) -> Array:
    return jax.lax.optimization_barrier(x).swapaxes(-1, -2)


def _attend_bwd(res, d_out):
    q, k, v, row_masked, out, e, total = res
    p = e / total
    d_out32 = d_out.astype(jnp.float32)
    # dv and dk contract over Q, the second-minor axis of both operands: XLA:CPU runs that
    # batched matmul ~3x faster writing [.., H, S] than [.., S, H], so it writes [.., H, S]
    # and transposes after (the barrier stops XLA from folding the transpose back in).
    dv = _transposed(jnp.einsum("BKQS,BKQH->BKHS", p.astype(v.dtype), d_out.astype(v.dtype),
                                preferred_element_type=jnp.float32))
    dp = jnp.einsum("BKQH,BKSH->BKQS", d_out.astype(v.dtype), v,
                    preferred_element_type=jnp.float32)
    # d softmax: p * (dp - sum_s p dp), and sum_s p dp = sum_h d_out * out (no [.., S] pass).
    # Masked scores get no gradient, also in rows where every key is masked (there the
    # forward is a constant uniform average).
    delta = jnp.sum(d_out32 * out.astype(jnp.float32), axis=-1, keepdims=True)
    ds = jnp.where(row_masked, 0.0, p * (dp - delta)).astype(q.dtype)
    dq = jnp.einsum("BKQS,BKSH->BKQH", ds, k, preferred_element_type=jnp.float32)
    dk = _transposed(jnp.einsum("BKQS,BKQH->BKHS", ds, q, preferred_element_type=jnp.float32))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None  # bias: a mask


_attend.defvjp(_attend_fwd, _attend_bwd)


def self_attention(q: Array, k: Array, v: Array, bias: Array) -> Array:
    """Grouped-query attention over whole sequences.

    q: [B, K, G, T, H]; k, v: [B, K, S, H]; bias: [B, T, S] float32 additive mask.
    Returns [B, K, G, T, H] in q's dtype.
    """
    b, kk, g, t, h = q.shape
    s = k.shape[2]
    bias = jnp.broadcast_to(bias[:, None, None], (b, 1, g, t, s)).reshape(b, 1, g * t, s)
    out = _attend((q * h ** -0.5).reshape(b, kk, g * t, h), k, v, bias)
    return out.reshape(b, kk, g, t, h)


def decode_attention(q: Array, prompt_k: Array, prompt_v: Array, gen_k: Array, gen_v: Array,
                     prompt_mask: Array, gen_mask: Array) -> Array:
    """One query per row against the shared prompt cache and the row's own generated cache.

    q: [B*R, K, G, H]; keys are stored transposed, prompt_k [B, K, H, P] and gen_k
    [B*R, K, H, N] (this step's key already written); prompt_v [B, K, P, H], gen_v
    [B*R, K, N, H]; prompt_mask: [B, P] bool; gen_mask: [N] bool. Returns [B*R, K, G, H].

    Broadcast-multiply-reduce rather than dot_general: per (row, head) these are [G, H] x
    [H, S] products, far too small for a GEMM call each. Both contractions reduce over the
    second-minor axis (H of the transposed keys, S of the values), which XLA:CPU streams at
    memory speed; reducing over a minor axis instead is ~20x slower there.
    """
    b, kk, h, p = prompt_k.shape
    r, g, n = q.shape[0] // b, q.shape[2], gen_k.shape[3]
    out_dtype = q.dtype  # the compute dtype: the residual stream must keep it (nn.scan carry)
    q = (q * h ** -0.5).reshape(b, r, kk, g, h, 1).astype(jnp.float32)  # [B, R, K, G, H, 1]
    gen_k = gen_k.reshape(b, r, kk, 1, h, n)
    gen_v = gen_v.reshape(b, r, kk, 1, n, h)
    s_prompt = jnp.sum(q * prompt_k[:, None, :, None], axis=-2)  # [B, R, K, G, P]
    # The barrier keeps XLA:CPU from fusing the two score reductions into one loop when they
    # have the same shape (R = 1 and N = P): that fusion ran 15-30x slower (measured).
    s_gen = jnp.sum(jax.lax.optimization_barrier(q) * gen_k, axis=-2)  # [B, R, K, G, N]
    s_prompt = jnp.where(prompt_mask[:, None, None, None, :], s_prompt, NEG_INF)
    s_gen = jnp.where(gen_mask, s_gen, NEG_INF)
    top = jnp.maximum(jnp.max(s_prompt, axis=-1, keepdims=True),
                      jnp.max(s_gen, axis=-1, keepdims=True))
    e_prompt, e_gen = jnp.exp(s_prompt - top), jnp.exp(s_gen - top)
    total = jnp.sum(e_prompt, axis=-1, keepdims=True) + jnp.sum(e_gen, axis=-1, keepdims=True)
    out = (jnp.sum(e_prompt[..., None] * prompt_v[:, None, :, None], axis=-2)
           + jnp.sum(e_gen[..., None] * gen_v, axis=-2)) / total
    return out.reshape(b * r, kk, g, h).astype(out_dtype)
