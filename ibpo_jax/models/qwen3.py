"""Qwen3 dense decoder in flax.linen, with HF `Qwen3ForCausalLM` semantics.

Per layer: x += o_proj(attn(rope(q_norm(q_proj(rms(x)))), rope(k_norm(k_proj(rms(x)))), v));
x += down(silu(gate(rms(x))) * up(rms(x))); then a final RMSNorm and the (tied or untied)
unembedding. Softmax, norms, RoPE and logits run in float32 whatever the compute dtype.

Three ways through the layers, with the same weights and the same `Block`:
- `Qwen3.encode`: a whole [B, T] sequence (training, scoring, prompt prefill), causal and padding
  mask; also returns every layer's keys/values (the sampler's prompt cache);
- `Qwen3.encode_grouped`: R responses per prompt, the prompt encoded once (not R times) and
  its keys/values shared by the R responses' attention (training on groups of samples);
- `Qwen3.decode`: one new token per row against a KV cache split in two parts: the prompt part
  (B rows) shared by the R samples of each prompt (never copied R times) and the generated
  part (B*R rows), carried through the layers and updated in place (layouts: `KVCache`).

Einsum axis alphabet: B batch, T query positions, S key positions / cache slots, D hidden,
N query heads, K key/value heads, G query heads per key/value head (query head n = k*G + g, as
HF's `repeat_kv`), H head_dim, F MLP hidden, V vocab, R samples per prompt, L layers; M flattened
tokens (B*T) of a 2-D projection.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from ibpo_jax import sharding
from ibpo_jax.models import attention
from ibpo_jax.models.config import ModelOptions, Qwen3Config

Array = jax.Array


class SeqContext(NamedTuple):
    """Inputs shared by every layer when encoding whole sequences."""

    cos: Array  # [B, T, H/2] float32
    sin: Array  # [B, T, H/2] float32
    bias: Array  # [B, T, S] float32, S == T: 0 where key s is visible from query t, else -1e30


class GroupedContext(NamedTuple):
    """Inputs of `Qwen3.encode_grouped`: the prompts' own (bias [B, P, P]) and the responses'
    (bias [B*R, N, P + N]: the row's prompt, then its own earlier response tokens)."""

    prompt: SeqContext
    response: SeqContext


class DecodeContext(NamedTuple):
    """Inputs shared by every layer for one decode step (one token per row)."""

    cos: Array  # [B*R, 1, H/2] float32
    sin: Array  # [B*R, 1, H/2] float32
    prompt_mask: Array  # [B, P] bool: real (not padding) prompt positions
    gen_mask: Array  # [N] bool: generated-cache slots written so far, this step's included
    index: Array  # int32 scalar: the slot this step's key/value go to


class KVCache(NamedTuple):
    """Prompt keys/values (shared by the R samples of a prompt) and generated ones. Each field
    is a stacked [L, ...] array (scan_layers) or a tuple of L per-layer arrays."""

    prompt_k: Any  # [L, B, K, H, P] (keys transposed: see attention.decode_attention)
    prompt_v: Any  # [L, B, K, P, H]
    gen_k: Any  # [L, B*R, K, H, N]
    gen_v: Any  # [L, B*R, K, N, H]


def positions_from_mask(mask: Array) -> Array:
    """Position ids [B, T] int32 from an attention mask [B, T]: padding (left or right) takes
    no position; as HF `generate` derives them."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def positions_from_segments(segments: Array) -> Array:
    """Position ids [B, T] int32 of packed rows: segments [B, T] int (0 = padding, else the id
    of the sequence the token belongs to; each sequence contiguous) -> the offset of each token
    from its sequence's first token."""
    t = jnp.arange(segments.shape[-1], dtype=jnp.int32)
    first = jnp.concatenate([jnp.ones_like(segments[:, :1], bool),
                             segments[:, 1:] != segments[:, :-1]], axis=-1)
    return t - jax.lax.cummax(jnp.where(first, t, 0), axis=segments.ndim - 1)


def rope_tables(positions: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
    """cos, sin [..., H/2] float32 for integer positions [...] (HF default RoPE; HF repeats
    these tables twice along H)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(freqs), jnp.sin(freqs)


def _apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """x [B, ..., T, H] float32; cos/sin [B, T, H/2]. HF `x * cos + rotate_half(x) * sin`,
    written on the two halves of H."""
    half = x.shape[-1] // 2
    extra = (slice(None),) + (None,) * (x.ndim - 3)
    cos, sin = cos[extra], sin[extra]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


@jax.custom_vjp
def swiglu(a: Array, b: Array) -> Array:
    """silu(a) * b, elementwise. Its VJP keeps only (a, b) and recomputes the sigmoid, so the
    forward and the backward are one fused pass each (autodiff keeps silu(a) and sigmoid(a)
    too, and XLA:CPU then runs the products as separate passes over [M, F])."""
    return jax.nn.silu(a) * b


def _swiglu_fwd(a, b):
    return swiglu(a, b), (a, b)


def _swiglu_bwd(res, dh):
    a, b = res
    sig = jax.nn.sigmoid(a)
    return dh * b * sig * (1 + a * (1 - sig)), dh * a * sig  # d silu = sig (1 + a (1 - sig))


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


def dense(x: Array, w: Array, dtype: Any) -> Array:
    """x [M, I] @ w [I, ...] (weight axes after the first flattened) -> [M, O] in `dtype`.

    Every projection runs as this one 2-D matmul over flattened tokens: both of its gradients
    are then plain 2-D matmuls too, where the backward of a batched einsum such as
    "BTD,DF->BTF" goes through transposing copies on XLA:CPU (~1.7x slower MLP training).
    """
    return x @ w.reshape(x.shape[-1], -1).astype(dtype)


def rms_norm(x: Array, scale: Array, eps: float, dtype: Any) -> Array:
    """HF Qwen3RMSNorm: normalize in float32, scale, return in `dtype`."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (scale.astype(jnp.float32) * y).astype(dtype)


class Attention(nn.Module):
    """Grouped-query attention with q/k RMSNorm over head_dim and RoPE; no biases.

    Weights are stored per head ([D, N, H], [D, K, H], [N, H, D]) and used flattened (`dense`).
    """

    config: Qwen3Config
    options: ModelOptions
    layout: sharding.ShardingSpec

    def setup(self):
        c, pd = self.config, self.options.param_dtype
        init = nn.initializers.normal(c.initializer_range)
        d, n, k, h = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = self.param("q_proj", init, (d, n, h), pd)
        self.k_proj = self.param("k_proj", init, (d, k, h), pd)
        self.v_proj = self.param("v_proj", init, (d, k, h), pd)
        self.o_proj = self.param("o_proj", init, (n, h, d), pd)
        self.q_norm = self.param("q_norm", nn.initializers.ones, (h,), pd)
        self.k_norm = self.param("k_norm", nn.initializers.ones, (h,), pd)

    def qkv(self, x: Array, cos: Array, sin: Array) -> tuple[Array, Array, Array]:
        """x [B, T, D] -> q [B, K, G, T, H], k [B, K, T, H], v [B, K, T, H] (compute dtype),
        q and k normalized and rotated."""
        c, dt = self.config, self.options.dtype
        b, t, d = x.shape
        kk, g, h = c.num_key_value_heads, c.num_groups, c.head_dim
        x2 = x.reshape(b * t, d)
        q = dense(x2, self.q_proj, dt).reshape(b, t, kk, g, h).transpose(0, 2, 3, 1, 4)
        k = dense(x2, self.k_proj, dt).reshape(b, t, kk, h).transpose(0, 2, 1, 3)
        v = dense(x2, self.v_proj, dt).reshape(b, t, kk, h).transpose(0, 2, 1, 3)
        eps = c.rms_norm_eps
        q = _apply_rope(rms_norm(q, self.q_norm, eps, jnp.float32), cos, sin).astype(dt)
        k = _apply_rope(rms_norm(k, self.k_norm, eps, jnp.float32), cos, sin).astype(dt)
        q = sharding.constrain(q, self.layout.act_bkgth)
        k = sharding.constrain(k, self.layout.act_bkth)
        v = sharding.constrain(v, self.layout.act_bkth)
        return q, k, v

    def grouped(self, xp: Array, xr: Array, ctx: GroupedContext) -> tuple[Array, Array]:
        """xp [B, P, D] prompts, xr [B*R, N, D] responses -> their attention outputs. The
        responses attend to their prompt's keys/values, computed once and repeated R times
        (autodiff sums the R gradients back into the one prompt)."""
        qp, kp, vp = self.qkv(xp, ctx.prompt.cos, ctx.prompt.sin)
        qr, kr, vr = self.qkv(xr, ctx.response.cos, ctx.response.sin)
        r = xr.shape[0] // xp.shape[0]
        op = attention.self_attention(qp, kp, vp, ctx.prompt.bias)
        k_all = jnp.concatenate([jnp.repeat(kp, r, axis=0), kr], axis=2)  # [B*R, K, P+N, H]
        v_all = jnp.concatenate([jnp.repeat(vp, r, axis=0), vr], axis=2)
        o_r = attention.self_attention(qr, k_all, v_all, ctx.response.bias)
        return self.out(op.transpose(0, 3, 1, 2, 4)), self.out(o_r.transpose(0, 3, 1, 2, 4))

    def out(self, o: Array) -> Array:
        """o [B, T, K, G, H] -> [B, T, D] (heads minor, so the weight is used as stored)."""
        b, t = o.shape[:2]
        return dense(o.reshape(b * t, -1), self.o_proj, self.options.dtype).reshape(b, t, -1)

    def seq(self, x: Array, ctx: SeqContext) -> tuple[Array, tuple[Array, Array]]:
        q, k, v = self.qkv(x, ctx.cos, ctx.sin)
        o = attention.self_attention(q, k, v, ctx.bias)
        return self.out(o.transpose(0, 3, 1, 2, 4)), (k, v)


class Mlp(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); no biases."""

    config: Qwen3Config
    options: ModelOptions
    layout: sharding.ShardingSpec

    @nn.compact
    def __call__(self, x: Array) -> Array:
        c, dt, pd = self.config, self.options.dtype, self.options.param_dtype
        init = nn.initializers.normal(c.initializer_range)
        d, f = c.hidden_size, c.intermediate_size
        gate = self.param("gate_proj", init, (d, f), pd)
        up = self.param("up_proj", init, (d, f), pd)
        down = self.param("down_proj", init, (f, d), pd)
        b, t, _ = x.shape
        x2 = x.reshape(b * t, d)
        hidden = swiglu(dense(x2, gate, dt), dense(x2, up, dt))  # [M, F]
        hidden = sharding.constrain(hidden.reshape(b, t, f), self.layout.act_btf)
        return dense(hidden.reshape(b * t, f), down, dt).reshape(b, t, d)


class Block(nn.Module):
    """One decoder layer. `carry` is x [B, T, D] (SeqContext) or (x, gen_k, gen_v)
    (DecodeContext) with the generated cache: the full stacked [L, ...] arrays when scanned,
    this layer's arrays when unrolled; `xs` is None or (layer index, or None for a per-layer
    cache; prompt_k, prompt_v of this layer). `ys`: this layer's (k, v) (encode) or None.
    Signature fits `nn.scan`."""

    config: Qwen3Config
    options: ModelOptions
    layout: sharding.ShardingSpec

    def setup(self):
        pd, d = self.options.param_dtype, self.config.hidden_size
        self.input_norm = self.param("input_norm", nn.initializers.ones, (d,), pd)
        self.post_attn_norm = self.param("post_attn_norm", nn.initializers.ones, (d,), pd)
        self.attn = Attention(self.config, self.options, self.layout)
        self.mlp = Mlp(self.config, self.options, self.layout)

    def __call__(self, carry: Any, xs: Any, ctx: SeqContext | GroupedContext | DecodeContext
                 ) -> tuple[Any, Any]:
        eps, dt = self.config.rms_norm_eps, self.options.dtype
        if isinstance(ctx, GroupedContext):  # carry: prompts [B, P, D], responses [B*R, N, D]
            xp, xr = carry
            hp, hr = self.attn.grouped(rms_norm(xp, self.input_norm, eps, dt),
                                       rms_norm(xr, self.input_norm, eps, dt), ctx)
            out = []
            for x in (xp + hp, xr + hr):
                x = x + self.mlp(rms_norm(x, self.post_attn_norm, eps, dt))
                out.append(sharding.constrain(x, self.layout.act_btd))
            return tuple(out), None
        if isinstance(ctx, SeqContext):
            x = carry
            # Each layer's (k, v) is returned for a prompt cache; unused, it is dead code.
            h, ys = self.attn.seq(rms_norm(x, self.input_norm, eps, dt), ctx)
        else:
            x, cache_k, cache_v = carry
            layer, prompt_k, prompt_v = xs
            q, k_new, v_new = self.attn.qkv(rms_norm(x, self.input_norm, eps, dt),
                                            ctx.cos, ctx.sin)
            # Write this step's key/value into slot `index` (keys are cached transposed,
            # [.., H, N]), then read the layer back: write-before-read lets XLA update the
            # loop-carried cache in place.
            cache_k, gen_k = _write_slot(cache_k, k_new.swapaxes(2, 3), layer, ctx.index, -1)
            cache_v, gen_v = _write_slot(cache_v, v_new, layer, ctx.index, -2)
            o = attention.decode_attention(q[:, :, :, 0], prompt_k, prompt_v, gen_k, gen_v,
                                           ctx.prompt_mask, ctx.gen_mask)
            h = self.attn.out(o[:, None])
            ys = None
        x = x + h
        x = x + self.mlp(rms_norm(x, self.post_attn_norm, eps, dt))
        x = sharding.constrain(x, self.layout.act_btd)
        return (x if isinstance(ctx, SeqContext) else (x, cache_k, cache_v)), ys


def _write_slot(cache: Array, new: Array, layer: Array | None, index: Array, axis: int
                ) -> tuple[Array, Array]:
    """Writes `new` (one slot, size 1 on `axis`) at slot `index` of this layer's cache ->
    (the updated cache, this layer's array). `cache` is this layer's array (layer None), or
    the stacked [L, ...] one (indexing a size-1 layer axis instead copies the whole per-layer
    cache every step on XLA:CPU)."""
    new = new.astype(cache.dtype)
    if layer is None:
        starts = [0] * cache.ndim
        starts[axis] = index
        cache = jax.lax.dynamic_update_slice(cache, new, starts)
        return cache, cache
    starts = [0] * cache.ndim
    starts[0], starts[axis] = layer, index
    cache = jax.lax.dynamic_update_slice(cache, new[None], starts)
    return cache, jax.lax.dynamic_index_in_dim(cache, layer, 0, keepdims=False)


_REMAT_POLICIES = {
    "full": None,  # save nothing inside a layer
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep x @ W outputs
}


class Qwen3(nn.Module):
    """The decoder: embedding, layers (scanned or unrolled), final norm, unembedding, and the
    optional value head. Call its methods through `Module.apply(..., method=...)`."""

    config: Qwen3Config
    options: ModelOptions
    layout: sharding.ShardingSpec = sharding.TRAINING

    def setup(self):
        c, o = self.config, self.options
        init = nn.initializers.normal(c.initializer_range)
        self.embedding = self.param("embedding", init, (c.vocab_size, c.hidden_size),
                                    o.param_dtype)
        block = Block
        if o.remat != "none":
            block = nn.remat(Block, policy=_REMAT_POLICIES[o.remat], prevent_cse=not o.scan_layers)
        if o.scan_layers:
            self.layers = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                                  in_axes=(0, nn.broadcast), length=c.num_hidden_layers,
                                  )(c, o, self.layout)
        else:
            self.layers = [block(c, o, self.layout) for _ in range(c.num_hidden_layers)]
        self.final_norm = self.param("final_norm", nn.initializers.ones, (c.hidden_size,),
                                     o.param_dtype)
        if not c.tie_word_embeddings:
            self.lm_head = self.param("lm_head", init, (c.hidden_size, c.vocab_size),
                                      o.param_dtype)
        if o.value_head:
            self.value_head = self.param("value_head", init, (c.hidden_size,), o.param_dtype)
            self.value_bias = self.param("value_bias", nn.initializers.zeros, (), o.param_dtype)

    def _layers(self, carry: Any, xs: Any, ctx: Any) -> tuple[Any, Any]:
        """Runs the blocks; per-layer outputs come back stacked [L, ...] (scan) or as a
        tuple of L arrays (unrolled)."""
        if self.options.scan_layers:
            return self.layers(carry, xs, ctx)
        ys = []
        for i, layer in enumerate(self.layers):
            carry, y = layer(carry, jax.tree.map(lambda a, i=i: a[i], xs), ctx)
            ys.append(y)
        return carry, (tuple(zip(*ys)) if ys[0] is not None else None)

    def _embed(self, tokens: Array) -> Array:
        # Out-of-range ids clamp (no NaN fill): no bounds select in every consumer fusion.
        x = jnp.take(self.embedding, tokens, axis=0, mode="clip").astype(self.options.dtype)
        return sharding.constrain(x, self.layout.act_btd)

    def encode(self, tokens: Array, positions: Array, mask: Array,
               segments: Array | None = None) -> tuple[Array, tuple[Array, Array]]:
        """tokens, positions [B, T] int32, mask [B, T] bool -> final-normed hidden [B, T, D]
        and every layer's (k, v) [B, K, T, H], stacked [L, ...] when scanned, else tuples of
        L arrays (dead code unless a prompt cache uses them). With `segments` [B, T] int
        (packed rows), a token sees only the earlier tokens of its own segment."""
        t = tokens.shape[1]
        allowed = jnp.tril(jnp.ones((t, t), dtype=bool))[None] & mask[:, None, :]  # [B, T, S]
        if segments is not None:
            allowed &= segments[:, :, None] == segments[:, None, :]
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        ctx = SeqContext(cos, sin, attention.mask_bias(allowed))
        x, kv = self._layers(self._embed(tokens), None, ctx)
        return rms_norm(x, self.final_norm, self.config.rms_norm_eps, self.options.dtype), kv

    def encode_grouped(self, prompt: Array, prompt_mask: Array, response: Array
                       ) -> tuple[Array, Array]:
        """prompt [B, P] int32 left-padded, prompt_mask [B, P] bool, response [B*R, N] int32
        (row b*R + r continues prompt b) -> final-normed hidden of the prompts [B, P, D] and
        of the responses [B*R, N, D], equal to `encode` on each row's prompt + response (the
        response's padding must come after its real tokens)."""
        c = self.config
        (b, p), (br, n) = prompt.shape, response.shape
        r = br // b
        causal = lambda t: jnp.tril(jnp.ones((t, t), dtype=bool))
        prompt_len = jnp.sum(prompt_mask, axis=-1, dtype=jnp.int32)  # [B]
        pos_r = jnp.repeat(prompt_len, r)[:, None] + jnp.arange(n, dtype=jnp.int32)  # [B*R, N]
        sees_prompt = jnp.broadcast_to(jnp.repeat(prompt_mask, r, axis=0)[:, None], (br, n, p))
        allowed_r = jnp.concatenate(
            [sees_prompt, jnp.broadcast_to(causal(n)[None], (br, n, n))], axis=-1)
        ctx = GroupedContext(
            SeqContext(*rope_tables(positions_from_mask(prompt_mask), c.head_dim, c.rope_theta),
                       attention.mask_bias(causal(p)[None] & prompt_mask[:, None, :])),
            SeqContext(*rope_tables(pos_r, c.head_dim, c.rope_theta),
                       attention.mask_bias(allowed_r)))
        (xp, xr), _ = self._layers((self._embed(prompt), self._embed(response)), None, ctx)
        norm = lambda x: rms_norm(x, self.final_norm, c.rms_norm_eps, self.options.dtype)
        return norm(xp), norm(xr)

    def decode(self, tokens: Array, positions: Array, cache: KVCache, prompt_mask: Array,
               gen_mask: Array, index: Array) -> tuple[Array, KVCache]:
        """One step: tokens, positions [B*R] -> hidden [B*R, D] and the cache with this
        step's keys/values written at generated slot `index`.

        Unrolled, the cache fields are tuples of per-layer arrays, each updated in place with
        no per-step slicing copies; scanned, they are stacked [L, ...] arrays carried through
        the scan (compile time over speed)."""
        c = self.config
        cos, sin = rope_tables(positions[:, None], c.head_dim, c.rope_theta)
        ctx = DecodeContext(cos, sin, prompt_mask, gen_mask, index)
        x = self._embed(tokens[:, None])
        if self.options.scan_layers:
            layer_ids = jnp.arange(c.num_hidden_layers)
            (x, gen_k, gen_v), _ = self.layers(
                (x, cache.gen_k, cache.gen_v), (layer_ids, cache.prompt_k, cache.prompt_v), ctx)
        else:
            gen_k, gen_v = list(cache.gen_k), list(cache.gen_v)
            for i, layer in enumerate(self.layers):
                (x, gen_k[i], gen_v[i]), _ = layer((x, gen_k[i], gen_v[i]),
                                                   (None, cache.prompt_k[i], cache.prompt_v[i]),
                                                   ctx)
            gen_k, gen_v = tuple(gen_k), tuple(gen_v)
        x = rms_norm(x[:, 0], self.final_norm, c.rms_norm_eps, self.options.dtype)
        return x, cache._replace(gen_k=gen_k, gen_v=gen_v)

    def logits(self, hidden: Array) -> Array:
        """hidden [..., D] -> float32 logits [..., V]."""
        dt = self.options.dtype
        lead, d = hidden.shape[:-1], hidden.shape[-1]
        h2 = hidden.reshape(-1, d)  # [M, D]: 2-D matmul (see `dense`)
        if self.config.tie_word_embeddings:
            out = jax.lax.dot_general(h2, self.embedding.astype(dt), (((1,), (1,)), ((), ())),
                                      preferred_element_type=jnp.float32)
        else:
            out = jnp.matmul(h2, self.lm_head.astype(dt), preferred_element_type=jnp.float32)
        out = out.reshape(*lead, -1)
        return sharding.constrain(out, self.layout.logits_btv) if out.ndim == 3 else out

    def values(self, hidden: Array) -> Array:
        """hidden [..., D] -> float32 values [...] (value head)."""
        return (jnp.einsum("...D,D->...", hidden.astype(jnp.float32),
                           self.value_head.astype(jnp.float32))
                + self.value_bias.astype(jnp.float32))

    def init_all(self, tokens: Array) -> Array:
        """Touches every parameter (for `Module.init`)."""
        mask = jnp.ones(tokens.shape, dtype=bool)
        hidden, _ = self.encode(tokens, positions_from_mask(mask), mask)
        out = self.logits(hidden)
        if self.options.value_head:
            out = out + self.values(hidden)[..., None]
        return out
