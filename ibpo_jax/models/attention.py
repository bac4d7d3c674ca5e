"""Attention for Qwen3 (pure functions, float32 softmax): a structural mask, one entry point
over several kernels, and decode attention against the sampler's two-part KV cache.

`Mask` says who may attend to whom without any [T, S] array: per-row segment ids of queries
and keys, with queries the last T of the S key positions. Each kernel derives its mask from it
blockwise; only `dense` ever builds the [T, S] bias.

`self_attention(q, k, v, mask, implementation)` serves training, scoring and prefill:
- "dense": scores [.., T, S] in one go with a hand-written VJP (the FlashAttention backward
  algebra, materialized: one pass over the scores and no softmax division saved), the
  fastest on CPU for short rows and the reference for the others;
- "chunked": blockwise XLA (`attention_chunked`), O(T * block) memory forward and backward;
- "cudnn": cuDNN flash attention through `jax.nn.dot_product_attention` (`attention_fused`);
- "splash": the TPU Pallas splash kernel (`attention_fused`);
- "auto": cudnn on GPU for 16-bit dtypes (chunked for float32, which cuDNN's flash kernel
  does not take), splash on one TPU chip (chunked under a mesh of several: splash is not
  wrapped in a shard_map yet), and on CPU dense up to T * S = `CPU_DENSE_MAX_TS`, chunked
  above.
A query row that sees no key (padding) gives 0 and passes no gradient, in every kernel.

`decode_attention` serves one new token per row against the shared prompt cache and the row's
own generated cache, reading the generated part blockwise up to its last filled slot.

Einsum axis alphabet: B batch, K key/value heads, G query heads per key/value head, Q = G*T
query rows of one key/value head, T query positions, S key positions / cache slots, H head_dim,
R samples per prompt.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from ibpo_jax.models import attention_chunked, attention_fused
from ibpo_jax.models.config import ATTENTION_IMPLEMENTATIONS

NEG_INF = -1e30  # finite: masked arithmetic never makes NaN
Array = jax.Array
IMPLEMENTATIONS = ATTENTION_IMPLEMENTATIONS
# `auto` on CPU: dense up to this many scores per row and head (T * S), chunked above (the
# measured crossover, see `choose`).
CPU_DENSE_MAX_TS = 2048 * 2048


@functools.partial(jax.tree_util.register_dataclass, data_fields=["q_segment", "kv_segment"],
                   meta_fields=["packed"])
@dataclasses.dataclass(frozen=True)
class Mask:
    """Who may attend to whom in a [B, T] x [B, S] attention, without a [T, S] array.

    Query t sits at key index t + S - T (the last T keys are the queries' own; S = T for
    self-attention). Query t sees key s iff s <= t + S - T (causal) and
    q_segment[t] == kv_segment[s] != 0. Segment 0 is padding: a padding key is never seen and
    a padding query sees nothing (its output is 0). `packed`: static, whether a row may hold
    several nonzero segments (packed sequences); the cuDNN route needs to know.
    """

    q_segment: Array  # [B, T] int32
    kv_segment: Array  # [B, S] int32
    packed: bool = False

    def allowed(self) -> Array:
        """The dense bool [B, T, S] this describes (dense kernel and tests only)."""
        t, s = self.q_segment.shape[1], self.kv_segment.shape[1]
        causal = jnp.arange(s)[None, :] <= jnp.arange(t)[:, None] + (s - t)
        q, kv = self.q_segment[:, :, None], self.kv_segment[:, None, :]
        return causal[None] & (q == kv) & (kv != 0)


def causal_mask(valid: Array, segments: Array | None = None) -> Mask:
    """Self-attention of [B, T] rows: valid [B, T] bool (padding left or right = False);
    segments [B, T] int (packed rows: 0 = padding, else the id of the contiguous sequence a
    token belongs to) or None (one sequence per row)."""
    seg = valid.astype(jnp.int32) if segments is None else jnp.where(valid, segments, 0)
    seg = seg.astype(jnp.int32)
    return Mask(seg, seg, packed=segments is not None)


def grouped_mask(prompt_valid: Array, samples: int, response_len: int) -> Mask:
    """Responses after their prompt: prompt_valid [B, P] bool (left padding = False); the
    queries are [B*R, C] response tokens (row b*R + r continues prompt b), the keys the
    prompt's P then the response's own C (causal)."""
    br = prompt_valid.shape[0] * samples
    ones = jnp.ones((br, response_len), jnp.int32)
    prompt = jnp.repeat(prompt_valid.astype(jnp.int32), samples, axis=0)
    return Mask(ones, jnp.concatenate([prompt, ones], axis=1))


def choose(implementation: str, t: int, s: int, dtype: jnp.dtype, packed: bool) -> str:
    """The kernel `implementation` ("auto" or one of them) runs for T x S scores of `dtype`.

    The CPU crossover, measured on jit(grad) of one call (B 1, K 4, G 2, H 64, float32, 1/8
    left padding, chunked tiles 512; Intel Xeon family 6 model 167, 2 cores shared with other
    jobs, so +-20 %), dense vs chunked ms: T = S = 512: 107 vs 128, 1024: 585 vs 654,
    2048: 1797 vs 2182, 4096: 10059 vs 6367. Dense wins up to 2048 and loses at 4096, where
    its [.., T, S] float32 scores also take GBs."""
    if implementation != "auto":
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"attention implementation {implementation!r}; valid: "
                             f"{IMPLEMENTATIONS}")
        return implementation
    platform = jax.default_backend()
    if platform == "gpu":
        sixteen_bit = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
        return "cudnn" if sixteen_bit and not packed else "chunked"
    if platform == "tpu":
        # The Pallas kernel has no partitioning rule: under a mesh of several devices GSPMD
        # could only run it on gathered inputs, so it needs a shard_map that is not built yet.
        return "splash" if jax.sharding.get_abstract_mesh().size <= 1 else "chunked"
    return "dense" if t * s <= CPU_DENSE_MAX_TS else "chunked"


def self_attention(q: Array, k: Array, v: Array, mask: Mask, implementation: str = "auto", *,
                   block_q: int = 512, block_kv: int = 512) -> Array:
    """Grouped-query attention over whole sequences.

    q: [B, K, G, T, H]; k, v: [B, K, S, H]; mask: `Mask` of [B, T] queries over [B, S] keys.
    implementation: one of IMPLEMENTATIONS; block_q, block_kv: chunked's tiles. Returns
    [B, K, G, T, H] in q's dtype (0 on query rows that see no key).
    """
    t, s, h = q.shape[3], k.shape[2], q.shape[-1]
    impl = choose(implementation, t, s, q.dtype, mask.packed)
    q = q * jnp.asarray(h ** -0.5, q.dtype)
    if impl == "dense":
        return dense_attention(q, k, v, mask)
    if impl == "chunked":
        return attention_chunked.chunked_attention(q, k, v, mask, block_q, block_kv)
    if impl == "cudnn":
        return attention_fused.cudnn_attention(q, k, v, mask, "cudnn", block_q, block_kv)
    return attention_fused.splash_attention(q, k, v, mask)


def _forward(q: Array, k: Array, v: Array, bias: Array) -> tuple[Array, Array, Array]:
    """q [B, K, Q, H] (pre-scaled), k/v [B, K, S, H], bias [B, 1, Q, S] -> out [B, K, Q, H]
    float32, exp(scores - rowmax) [B, K, Q, S] float32, 1 / row sums [B, K, Q, 1] (0 on rows
    with every key masked: their output and gradients are 0)."""
    s = jnp.einsum("BKQH,BKSH->BKQS", q, k, preferred_element_type=jnp.float32) + bias
    top = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s - top)
    inv = jnp.where(top < NEG_INF / 2, 0.0, 1.0 / jnp.sum(e, axis=-1, keepdims=True))
    out = jnp.einsum("BKQS,BKSH->BKQH", e.astype(v.dtype), v,
                     preferred_element_type=jnp.float32) * inv
    return out, e, inv


@jax.custom_vjp
def _attend(q: Array, k: Array, v: Array, bias: Array) -> Array:
    return _forward(q, k, v, bias)[0].astype(q.dtype)


def _attend_fwd(q, k, v, bias):
    out, e, inv = _forward(q, k, v, bias)
    out = out.astype(q.dtype)
    # Not the [.., Q, S] bias: masked entries already have p = 0 exactly (and whole masked
    # rows inv = 0).
    return out, (q, k, v, out, e, inv)


def _transposed(x: Array) -> Array:
    return jax.lax.optimization_barrier(x).swapaxes(-1, -2)


def _attend_bwd(res, d_out):
    q, k, v, out, e, inv = res
    p = e * inv
    d_out32 = d_out.astype(jnp.float32)
    # dv and dk contract over Q, the second-minor axis of both operands: XLA:CPU runs that
    # batched matmul ~3x faster writing [.., H, S] than [.., S, H], so it writes [.., H, S]
    # and transposes after (the barrier stops XLA from folding the transpose back in).
    dv = _transposed(jnp.einsum("BKQS,BKQH->BKHS", p.astype(v.dtype), d_out.astype(v.dtype),
                                preferred_element_type=jnp.float32))
    dp = jnp.einsum("BKQH,BKSH->BKQS", d_out.astype(v.dtype), v,
                    preferred_element_type=jnp.float32)
    # d softmax: p * (dp - sum_s p dp), and sum_s p dp = sum_h d_out * out (no [.., S] pass).
    delta = jnp.sum(d_out32 * out.astype(jnp.float32), axis=-1, keepdims=True)
    ds = (p * (dp - delta)).astype(q.dtype)
    dq = jnp.einsum("BKQS,BKSH->BKQH", ds, k, preferred_element_type=jnp.float32)
    dk = _transposed(jnp.einsum("BKQS,BKQH->BKHS", ds, q, preferred_element_type=jnp.float32))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None  # bias: a mask


_attend.defvjp(_attend_fwd, _attend_bwd)


def dense_attention(q: Array, k: Array, v: Array, mask: Mask) -> Array:
    """The reference kernel: q [B, K, G, T, H] pre-scaled, k/v [B, K, S, H] -> [B, K, G, T, H],
    through a dense float32 bias [B, 1, G*T, S] built from `mask`."""
    b, kk, g, t, h = q.shape
    s = k.shape[2]
    bias = jnp.where(mask.allowed(), 0.0, NEG_INF).astype(jnp.float32)  # [B, T, S]
    bias = jnp.broadcast_to(bias[:, None, None], (b, 1, g, t, s)).reshape(b, 1, g * t, s)
    out = _attend(q.reshape(b, kk, g * t, h), k, v, bias)
    return out.reshape(b, kk, g, t, h)


DECODE_BLOCK = 256  # generated-cache slots per step of decode attention's loop (not CPU)


def decode_attention(q: Array, prompt_k: Array, prompt_v: Array, gen_k: Array, gen_v: Array,
                     prompt_mask: Array, gen_mask: Array, block: int | None = None) -> Array:
    """One query per row against the shared prompt cache and the row's own generated cache.

    q: [B*R, K, G, H]; keys are stored transposed, prompt_k [B, K, H, P] and gen_k
    [B*R, K, H, N] (this step's key already written); prompt_v [B, K, P, H], gen_v
    [B*R, K, N, H]; prompt_mask: [B, P] bool; gen_mask: [N] bool (the written slots; at least
    one), or [B*R, N] where rows differ (slot refill's rows, at different steps:
    `sampler/refill.py`).
    Returns [B*R, K, G, H].

    A generated cache of at most `block` slots is read in one pass with the prompt's. A longer
    one is read in blocks of `block` slots up to its last written slot only (a loop whose
    bound is that slot), merged with the prompt's part by online softmax: a step costs the
    slots filled so far, not the cache's width. `block` None: `DECODE_BLOCK`, except on CPU,
    which always reads in one pass: there the blocks, slices along the minor (slot) axis of
    the transposed keys, ran 4-6x slower than one pass over the whole cache (64 rows, K 4,
    G 2, H 64, N 1024 slots, 100-1024 written: 240-540 ms vs 42-80 ms, measured), and the
    sampler's doubling widths already keep the unwritten slots under half the cache.

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
    if gen_mask.ndim == 2:  # per row: broadcast like the scores [B, R, K, G, N]
        gen_mask = gen_mask.reshape(b, r, 1, 1, n)
    s_prompt = jnp.sum(q * prompt_k[:, None, :, None], axis=-2)  # [B, R, K, G, P]
    s_prompt = jnp.where(prompt_mask[:, None, None, None, :], s_prompt, NEG_INF)
    if block is None:
        block = n if jax.default_backend() == "cpu" else DECODE_BLOCK
    if n > block:
        out = _decode_blocks(q, s_prompt, prompt_v, gen_k, gen_v, gen_mask, block)
        return out.reshape(b * r, kk, g, h).astype(out_dtype)
    # The barrier keeps XLA:CPU from fusing the two score reductions into one loop when they
    # have the same shape (R = 1 and N = P): that fusion ran 15-30x slower (measured).
    s_gen = jnp.sum(jax.lax.optimization_barrier(q) * gen_k, axis=-2)  # [B, R, K, G, N]
    s_gen = jnp.where(gen_mask, s_gen, NEG_INF)
    top = jnp.maximum(jnp.max(s_prompt, axis=-1, keepdims=True),
                      jnp.max(s_gen, axis=-1, keepdims=True))
    e_prompt, e_gen = jnp.exp(s_prompt - top), jnp.exp(s_gen - top)
    total = jnp.sum(e_prompt, axis=-1, keepdims=True) + jnp.sum(e_gen, axis=-1, keepdims=True)
    out = (jnp.sum(e_prompt[..., None] * prompt_v[:, None, :, None], axis=-2)
           + jnp.sum(e_gen[..., None] * gen_v, axis=-2)) / total
    return out.reshape(b * r, kk, g, h).astype(out_dtype)


def _decode_blocks(q: Array, s_prompt: Array, prompt_v: Array, gen_k: Array, gen_v: Array,
                   gen_mask: Array, block: int) -> Array:
    """`decode_attention`'s blockwise path: q [B, R, K, G, H, 1] float32, prompt scores
    s_prompt [B, R, K, G, P] (masked), gen_k [B, R, K, 1, H, N], gen_v [B, R, K, 1, N, H],
    gen_mask [N] or [B, R, 1, 1, N] -> out [B, R, K, G, H] float32."""
    n = gen_k.shape[-1]
    top = jnp.max(s_prompt, axis=-1, keepdims=True)  # [B, R, K, G, 1]
    e = jnp.exp(s_prompt - top)
    init = (top, jnp.sum(e, axis=-1, keepdims=True),
            jnp.sum(e[..., None] * prompt_v[:, None, :, None], axis=-2))
    filled = jnp.max(jnp.where(gen_mask, jnp.arange(n) + 1, 0))  # one past the last written
    slots = jnp.arange(block)

    def step(j, carry):
        m, total, acc = carry
        # The last block starts early enough to stay inside the cache (N need not be a
        # multiple of the block); the slots it shares with the previous block are masked.
        start = jnp.minimum(j * block, n - block)
        k_j = jax.lax.dynamic_slice_in_dim(gen_k, start, block, axis=-1)
        v_j = jax.lax.dynamic_slice_in_dim(gen_v, start, block, axis=-2)
        ok = (jax.lax.dynamic_slice_in_dim(gen_mask, start, block, axis=-1)
              & (start + slots >= j * block))
        s = jnp.where(ok, jnp.sum(q * k_j, axis=-2), NEG_INF)  # [B, R, K, G, block]
        m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
        alpha, e = jnp.exp(m - m_new), jnp.exp(s - m_new)
        return (m_new, alpha * total + jnp.sum(e, axis=-1, keepdims=True),
                alpha * acc + jnp.sum(e[..., None] * v_j, axis=-2))

    _, total, acc = jax.lax.fori_loop(0, (filled + block - 1) // block, step, init)
    return acc / total
