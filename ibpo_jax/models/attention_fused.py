"""The fused accelerator kernels behind `attention.self_attention`: cuDNN flash attention (GPU,
through `jax.nn.dot_product_attention`) and Pallas splash attention (TPU).

Both take q [B, K, G, T, H] pre-scaled, k/v [B, K, S, H] and a structural `attention.Mask`
(query t sits at key index t + S - T; it sees key s iff s <= t + S - T and
q_segment[t] == kv_segment[s] != 0), and return [B, K, G, T, H] with 0 on query rows of
segment 0. Neither is ever given a dense [T, S] mask. Axis alphabet as in `attention`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ibpo_jax.models import attention_chunked

Array = jax.Array


def _heads_minor(x: Array) -> Array:
    """[B, K, (G,) L, H] -> [B, L, K*G, H] (head n = k*G + g, as jax's GQA grouping)."""
    if x.ndim == 5:
        b, kk, g, length, h = x.shape
        return x.transpose(0, 3, 1, 2, 4).reshape(b, length, kk * g, h)
    return x.transpose(0, 2, 1, 3)


def cudnn_attention(q: Array, k: Array, v: Array, mask: Any, implementation: str | None = "cudnn",
                    block_q: int = 512, block_kv: int = 512) -> Array:
    """`jax.nn.dot_product_attention` with only is_causal, by re-laying the rows.

    Its public mask arguments are a top-left causal mask and right padding lengths; ours has
    left padding (prompts) and queries offset into the keys (responses after a prompt). Both
    are the same mask after a per-row permutation, for masks without packing: move each row's
    real keys (segment != 0) to the front in order (a stable argsort), and put the real query
    t at row n_t - 1 of an S-row query array, n_t = the number of real keys in its causal
    window (key indices <= t + S - T). Top-left causal attention then shows that row exactly
    those n_t keys; the other query rows are dummies whose outputs are dropped. This needs a
    real query's own key (index t + S - T) to be real, so that real queries get distinct rows:
    true of `attention.causal_mask` and `attention.grouped_mask`. No sequence lengths are
    passed (every dummy row sees key 0, so no row is empty and nothing can be NaN). Extra cost:
    S - T dummy query rows (the prompt's length for grouped rows, 0 otherwise; causal skipping
    makes most of them cheap) and gathers linear in S.

    Packed masks (several segments per row) cannot be laid out this way: they run `chunked`
    (cuDNN's packed-offsets layout is not in the public API). `implementation="xla"` runs the
    same mapping through XLA's reference implementation (what the CPU tests check).
    """
    if mask.packed:
        return attention_chunked.chunked_attention(q, k, v, mask, block_q, block_kv)
    b, kk, g, t, h = q.shape
    s = k.shape[2]
    real_key = mask.kv_segment != 0  # [B, S]
    order = jnp.argsort(~real_key, axis=-1, stable=True)  # real keys first, in order
    k_c = jnp.take_along_axis(k, order[:, None, :, None], axis=2)
    v_c = jnp.take_along_axis(v, order[:, None, :, None], axis=2)
    seen = jnp.cumsum(real_key, axis=-1, dtype=jnp.int32)[:, s - t:]  # [B, T]: n_t
    placed = (mask.q_segment != 0) & (seen > 0)
    row = jnp.where(placed, seen - 1, s)  # s: out of range, dropped by the scatter
    batch = jnp.arange(b)[:, None]
    q_rows = jnp.zeros((b, s, kk * g, h), q.dtype).at[batch, row].set(_heads_minor(q),
                                                                        mode="drop")
    out = jax.nn.dot_product_attention(q_rows, _heads_minor(k_c), _heads_minor(v_c), scale=1.0,
                                       is_causal=True, implementation=implementation)
    out = out[batch, jnp.minimum(row, s - 1)]  # [B, T, N, H]
    out = jnp.where(placed[:, :, None, None], out, 0).astype(q.dtype)
    return out.reshape(b, t, kk, g, h).transpose(0, 2, 3, 1, 4)


SPLASH_BLOCK = 128  # the TPU kernel's tile (lanes); lengths are padded to a multiple


@functools.lru_cache(maxsize=64)
def _splash_kernel(groups: int, t: int, s: int, offset: int, block: int, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    mask = splash.MultiHeadMask([splash.CausalMask((t, s), offset=offset)] * groups)
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                              block_q_dkv=block, block_kv_dkv=block,
                              block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    # MQA form per key/value head: q [G, T, H] against k, v [S, H]. Built with concrete
    # arrays even when first called under a trace: the kernel is cached across traces.
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mqa_single_device(mask, block_sizes=sizes,
                                                    interpret=interpret)


def splash_attention(q: Array, k: Array, v: Array, mask: Any, block: int = SPLASH_BLOCK,
                     interpret: bool | None = None) -> Array:
    """Pallas splash attention (TPU; `interpret` runs its Pallas interpreter, as on CPU).

    The causal part is splash's static `CausalMask` with offset S - T and the rest its
    per-row `SegmentIds`, vmapped over batch and key/value heads (GQA as one MQA kernel per
    key/value head). Splash lets q see k when their segment ids are equal, 0 included, and
    needs every query row to see some key (else its softmax divides by 0), so query rows of
    segment 0 (padding, and the rows padded up to the tile) take the segment of the key at
    their own index, which they then see; their outputs are zeroed after. A query of nonzero
    segment must see its own key (index t + S - T), as in `attention.causal_mask` and
    `attention.grouped_mask`. Single device: under a sharded mesh it needs a shard_map
    around it (not done here).
    """
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    b, kk, g, t, h = q.shape
    s = k.shape[2]
    offset = s - t
    tp = -(-t // block) * block
    sp = -(-max(s, tp + offset) // block) * block  # every padded query row has its own key
    kv_seg = attention_chunked.pad_to(mask.kv_segment.astype(jnp.int32), 1, sp)
    q_seg = attention_chunked.pad_to(mask.q_segment.astype(jnp.int32), 1, tp)
    own = jax.lax.dynamic_slice_in_dim(kv_seg, offset, tp, axis=1)
    q_seg = jnp.where(q_seg != 0, q_seg, own)
    kernel = _splash_kernel(g, tp, sp, offset, block, interpret)
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    def one(q1, k1, v1, qs, ks):  # q1 [G, Tp, H], k1/v1 [Sp, H], qs [Tp], ks [Sp]
        return kernel(q1, k1, v1, segment_ids=SegmentIds(qs, ks))

    per_head = jax.vmap(one, in_axes=(0, 0, 0, None, None))
    out = jax.vmap(per_head)(attention_chunked.pad_to(q, 3, tp),
                             attention_chunked.pad_to(k, 2, sp),
                             attention_chunked.pad_to(v, 2, sp), q_seg, kv_seg)
    real = np.arange(tp) < t
    keep = (jnp.pad(mask.q_segment, ((0, 0), (0, tp - t))) != 0) & real
    return jnp.where(keep[:, None, None, :, None], out, 0).astype(q.dtype)[:, :, :, :t]
