"""Qwen3 dense decoder in flax.linen, with HF `Qwen3ForCausalLM` semantics.

Per layer: x += o_proj(attn(rope(q_norm(q_proj(rms(x)))), rope(k_norm(k_proj(rms(x)))), v));
x += down(silu(gate(rms(x))) * up(rms(x))); then a final RMSNorm and the (tied or untied)
unembedding. Softmax, norms, RoPE and logits run in float32 whatever the compute dtype.

One call path through the layers (`Qwen3._layers`, the one place that decides `nn.scan` over
layers or a Python loop) and one `Block`/`Attention` call with an optional KV cache:
- no cache: whole [B, T] sequences attend to themselves (training, scoring, prompt prefill);
  every layer's (k, v) comes back, which the sampler keeps as its prompt cache (`encode`);
- a prompt cache only (`kv_cache.PromptKV`): R continuation rows per prompt attend to their
  prompt's keys/values, computed once, then causally to their own (`encode_grouped`: the
  prompts go through `encode` once, not R times);
- a prompt cache and a row cache (`kv_cache.RowKV`): one new token per row; its key/value are
  written into the row cache, then it attends to prompt and row cache (`decode`).

Einsum axis alphabet (this module, `attention`, `kv_cache`): B batch (prompts), R samples per
prompt, T query positions, S key positions, P prompt positions, C row-cache slots, D hidden,
N query heads, K key/value heads, G query heads per key/value head (query head n = k*G + g,
as HF's `repeat_kv`), H head_dim, F MLP hidden, V vocab, L layers; M flattened tokens (B*T)
of a 2-D projection.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from ibpo_jax.models import attention, kv_cache, lora
from ibpo_jax.models.config import ModelOptions, Qwen3Config
from ibpo_jax.runtime import sharding

Array = jax.Array
DROPOUT_RNG = "lora_dropout"  # the rng collection of the adapters' dropout (`project`)


class LayerInputs(NamedTuple):
    """Inputs shared by every layer of one pass (the `nn.scan` broadcast argument)."""

    cos: Array  # [B, T, H/2] float32
    sin: Array  # [B, T, H/2] float32
    mask: attention.Mask | None  # whole sequences: who sees whom (no [T, S] array)
    prompt_mask: Array | None = None  # [B, P] bool, decode: real (not padding) prompt slots
    slot_mask: Array | None = None  # [C] or [B*R, C] bool, decode: slots written, this one too
    index: Array | None = None  # int32 scalar or [B*R], decode: the slot this step's k/v go to
    # [B*R] int32, decode: each row's prompt in the prompt cache (slot refill); None: the R
    # consecutive rows b*R + r continue prompt b
    prompt_rows: Array | None = None


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


def project(module: nn.Module, x: Array, w: Array, name: str) -> Array:
    """`dense(x, w)` in the module's compute dtype, plus the LoRA adapter of weight `name`
    when the params hold one (`lora.delta`; the base alone, e.g. π_ref, has none). With
    `options.lora_dropout` > 0 and a "lora_dropout" rng in the apply (the update's gradient
    passes only), the adapter sees `lora.dropout(x)`: a key of its own per call (flax folds
    the module path and a per-module call count into the apply's key; `nn.scan` splits it
    per layer)."""
    dt, rate = module.options.dtype, module.options.lora_dropout
    out = dense(x, w, dt)
    if module.has_variable("params", name + lora.A):
        if rate > 0 and module.has_rng(DROPOUT_RNG):
            x = lora.dropout(x, key=module.make_rng(DROPOUT_RNG), rate=rate)
        out = out + lora.delta(x, module.get_variable("params", name + lora.A),
                               module.get_variable("params", name + lora.B),
                               module.options.lora_alpha, dt)
    return out


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
        proj = lambda w, name: project(self, x2, w, name)
        kk, g, h = c.num_key_value_heads, c.num_groups, c.head_dim
        x2 = x.reshape(b * t, d)
        q = proj(self.q_proj, "q_proj").reshape(b, t, kk, g, h).transpose(0, 2, 3, 1, 4)
        k = proj(self.k_proj, "k_proj").reshape(b, t, kk, h).transpose(0, 2, 1, 3)
        v = proj(self.v_proj, "v_proj").reshape(b, t, kk, h).transpose(0, 2, 1, 3)
        eps = c.rms_norm_eps
        q = _apply_rope(rms_norm(q, self.q_norm, eps, jnp.float32), cos, sin).astype(dt)
        k = _apply_rope(rms_norm(k, self.k_norm, eps, jnp.float32), cos, sin).astype(dt)
        q = sharding.constrain(q, self.layout.act_bkgth)
        k = sharding.constrain(k, self.layout.act_bkth)
        v = sharding.constrain(v, self.layout.act_bkth)
        return q, k, v

    def __call__(self, x: Array, ctx: LayerInputs, prompt: kv_cache.PromptKV | None,
                 rows: kv_cache.RowKV | None, layer: Array | None
                 ) -> tuple[Array, kv_cache.RowKV | None, tuple[Array, Array]]:
        """x [B*R, T, D] -> (attention output [B*R, T, D], the row cache with this step's
        keys/values written (decode) or None, this call's (k, v) [B*R, K, T, H]).

        prompt: None, or this layer's PromptKV of B = rows / R prompts that row b*R + r
        continues (attended to before the row's own keys); rows: None (the keys are x's own,
        masked by ctx.mask), or this layer's row cache (T = 1: write, then attend to prompt
        and row cache, masked by ctx.prompt_mask / ctx.slot_mask); `layer` indexes a stacked
        [L, ...] row cache (see `kv_cache.write`)."""
        q, k, v = self.qkv(x, ctx.cos, ctx.sin)  # [B*R, K, G, T, H], [B*R, K, T, H] x2
        if rows is not None:
            rows, view = kv_cache.write(rows, k, v, layer, ctx.index)
            if ctx.prompt_rows is not None:  # each row its prompt's keys/values
                prompt = kv_cache.PromptKV(jnp.take(prompt.k, ctx.prompt_rows, axis=0),
                                           jnp.take(prompt.v, ctx.prompt_rows, axis=0))
            o = attention.decode_attention(q[:, :, :, 0], prompt.k, prompt.v, view.k, view.v,
                                           ctx.prompt_mask, ctx.slot_mask)  # [B*R, K, G, H]
            o = o[:, :, :, None]  # [B*R, K, G, 1, H]
        else:
            keys, values = k, v
            if prompt is not None:  # the prompt's keys/values first, repeated for its R rows
                r = x.shape[0] // prompt.v.shape[0]
                keys = jnp.concatenate([jnp.repeat(prompt.k.swapaxes(-1, -2), r, axis=0), k],
                                       axis=2)  # [B*R, K, P+T, H]
                values = jnp.concatenate([jnp.repeat(prompt.v, r, axis=0), v], axis=2)
            o = attention.self_attention(  # [B*R, K, G, T, H]
                q, keys, values, ctx.mask, self.options.attention,
                block_q=self.options.attention_block_q, block_kv=self.options.attention_block_kv)
        return self.out(o.transpose(0, 3, 1, 2, 4)), rows, (k, v)

    def out(self, o: Array) -> Array:
        """o [B, T, K, G, H] -> [B, T, D] (heads minor, so the weight is used as stored)."""
        b, t = o.shape[:2]
        return project(self, o.reshape(b * t, -1), self.o_proj, "o_proj").reshape(b, t, -1)


class Mlp(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); no biases."""

    config: Qwen3Config
    options: ModelOptions
    layout: sharding.ShardingSpec

    @nn.compact
    def __call__(self, x: Array) -> Array:
        c, pd = self.config, self.options.param_dtype
        init = nn.initializers.normal(c.initializer_range)
        d, f = c.hidden_size, c.intermediate_size
        gate = self.param("gate_proj", init, (d, f), pd)
        up = self.param("up_proj", init, (d, f), pd)
        down = self.param("down_proj", init, (f, d), pd)
        b, t, _ = x.shape
        x2 = x.reshape(b * t, d)
        hidden = swiglu(project(self, x2, gate, "gate_proj"), project(self, x2, up, "up_proj"))
        hidden = sharding.constrain(hidden.reshape(b, t, f), self.layout.act_btf)
        return project(self, hidden.reshape(b * t, f), down, "down_proj").reshape(b, t, d)


class Block(nn.Module):
    """One decoder layer, its signature fit for `nn.scan`: carry (x [B*R, T, D], row cache
    or None), xs (layer index or None, prompt cache or None), ctx -> ((x, row cache), this
    layer's (k, v)). Caches are this layer's (unrolled) or, for the row cache, the stacked
    [L, ...] one indexed by `layer` (scanned); see `Attention.__call__`."""

    config: Qwen3Config
    options: ModelOptions
    layout: sharding.ShardingSpec

    def setup(self):
        pd, d = self.options.param_dtype, self.config.hidden_size
        self.input_norm = self.param("input_norm", nn.initializers.ones, (d,), pd)
        self.post_attn_norm = self.param("post_attn_norm", nn.initializers.ones, (d,), pd)
        self.attn = Attention(self.config, self.options, self.layout)
        self.mlp = Mlp(self.config, self.options, self.layout)

    def __call__(self, carry: tuple[Array, Any], xs: tuple[Any, Any], ctx: LayerInputs
                 ) -> tuple[tuple[Array, Any], tuple[Array, Array]]:
        eps, dt = self.config.rms_norm_eps, self.options.dtype
        x, rows = carry  # [B*R, T, D]
        layer, prompt = xs
        h, rows, kv = self.attn(rms_norm(x, self.input_norm, eps, dt), ctx, prompt, rows, layer)
        x = x + h
        x = x + self.mlp(rms_norm(x, self.post_attn_norm, eps, dt))
        return (sharding.constrain(x, self.layout.act_btd), rows), kv


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
            self.layers = nn.scan(block, variable_axes={"params": 0},
                                  split_rngs={"params": True, DROPOUT_RNG: True},
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

    def _layers(self, x: Array, ctx: LayerInputs, prompt: Any = None, rows: Any = None
                ) -> tuple[Array, Any, Any]:
        """The one place that runs the blocks, scanned or unrolled: x [B*R, T, D] -> (x, the
        row cache after its writes or None, every layer's (k, v) [B*R, K, T, H]). Caches and
        the (k, v) are stacked [L, ...] (scan) or tuples of L per-layer ones (unrolled)."""
        if self.options.scan_layers:
            layer_ids = jnp.arange(self.config.num_hidden_layers)
            (x, rows), kv = self.layers((x, rows), (layer_ids, prompt), ctx)
            return x, rows, kv
        kvs, new_rows = [], []
        for i, block in enumerate(self.layers):
            (x, r), kv = block((x, None if rows is None else rows[i]),
                               (None, None if prompt is None else prompt[i]), ctx)
            kvs.append(kv)
            new_rows.append(r)
        return x, (None if rows is None else tuple(new_rows)), tuple(kvs)

    def _embed(self, tokens: Array) -> Array:
        # Out-of-range ids clamp (no NaN fill): no bounds select in every consumer fusion.
        x = jnp.take(self.embedding, tokens, axis=0, mode="clip").astype(self.options.dtype)
        return sharding.constrain(x, self.layout.act_btd)

    def _final_norm(self, x: Array) -> Array:
        return rms_norm(x, self.final_norm, self.config.rms_norm_eps, self.options.dtype)

    def encode(self, tokens: Array, positions: Array, mask: Array,
               segments: Array | None = None) -> tuple[Array, Any]:
        """tokens, positions [B, T] int32, mask [B, T] bool -> final-normed hidden [B, T, D]
        and every layer's (k, v) [B, K, T, H]: one stacked [L, ...] pair when scanned, else a
        tuple of L pairs (dead code unless a prompt cache uses them). With `segments` [B, T]
        int (packed rows), a token sees only the earlier tokens of its own segment. A padding
        token sees no key (its attention output is 0; callers ignore padding positions)."""
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        ctx = LayerInputs(cos, sin, attention.causal_mask(mask, segments))
        x, _, kv = self._layers(self._embed(tokens), ctx)
        return self._final_norm(x), kv

    def encode_grouped(self, prompt: Array, prompt_mask: Array, response: Array
                       ) -> tuple[Array, Array]:
        """prompt [B, P] int32 left-padded, prompt_mask [B, P] bool, response [B*R, C] int32
        (row b*R + r continues prompt b) -> final-normed hidden of the prompts [B, P, D] and
        of the responses [B*R, C, D], equal to `encode` on each row's prompt + response (the
        response's padding must come after its real tokens).

        The prompts are encoded once; their keys/values are the responses' prompt cache
        (autodiff sums the R responses' gradients back into the one prompt)."""
        c = self.config
        b, (br, n) = prompt.shape[0], response.shape
        r = br // b
        hp, kv = self.encode(prompt, positions_from_mask(prompt_mask), prompt_mask)
        prompt_len = jnp.sum(prompt_mask, axis=-1, dtype=jnp.int32)  # [B]
        pos_r = jnp.repeat(prompt_len, r)[:, None] + jnp.arange(n, dtype=jnp.int32)  # [B*R, C]
        mask = attention.grouped_mask(prompt_mask, r, n)  # keys: the prompt's P, then own C
        ctx = LayerInputs(*rope_tables(pos_r, c.head_dim, c.rope_theta), mask)
        prompt_kv = kv_cache.prompt_cache(kv, self.options.scan_layers)
        xr, _, _ = self._layers(self._embed(response), ctx, prompt=prompt_kv)
        return hp, self._final_norm(xr)

    def decode(self, tokens: Array, positions: Array, cache: kv_cache.KVCache,
               prompt_mask: Array, slot_mask: Array, index: Array,
               prompt_rows: Array | None = None) -> tuple[Array, kv_cache.KVCache]:
        """One step: tokens, positions [B*R] (each < P + C) -> hidden [B*R, D] and the cache
        with this step's keys/values written at row-cache slot `index`; prompt_mask [B, P]
        bool, slot_mask [C] bool (the slots written so far, this one included). Slot refill's
        rows are at different steps and prompts: `index` [B*R] (each row's slot), slot_mask
        [B*R, C], and `prompt_rows` [B*R] (each row's prompt in the cache; prompt_mask then
        [B*R, P], the rows' own).

        Unrolled, the row cache is a tuple of per-layer arrays, each updated in place with
        no per-step slicing copies; scanned, a stacked [L, ...] one carried through the scan
        (compile time over speed)."""
        c = self.config
        # Positions are < P + C. Looked up in a table of those (loop-invariant, hoisted out of
        # the sampler's loop): computed from positions here, XLA:CPU fused cos/sin into every
        # head's RoPE of every layer and recomputed them there (3-7 % of a decode step).
        bound = prompt_mask.shape[1] + kv_cache.slots_of(cache.rows)
        cos_t, sin_t = rope_tables(jnp.arange(bound), c.head_dim, c.rope_theta)  # [P+C, H/2]
        cos, sin = cos_t[positions][:, None], sin_t[positions][:, None]  # [B*R, 1, H/2]
        ctx = LayerInputs(cos, sin, None, prompt_mask, slot_mask, index, prompt_rows)
        x, rows, _ = self._layers(self._embed(tokens[:, None]), ctx, cache.prompt, cache.rows)
        return self._final_norm(x[:, 0]), cache._replace(rows=rows)

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
