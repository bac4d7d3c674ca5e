"""Functional entry points of the Qwen3 model and the `Qwen3LM` convenience object.

The trainer calls `forward` / `token_logprobs` inside its own jitted step with `params` as an
argument (config and options are static), so one compilation serves every step. `Qwen3LM`
bundles (config, options, params, mesh) for interactive use; it is a pytree whose only leaves
are the params, so it can itself be passed through `jax.jit`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ibpo_jax.models.config import ModelOptions, Qwen3Config
from ibpo_jax.models.qwen3 import DROPOUT_RNG, Qwen3, positions_from_mask, positions_from_segments
from ibpo_jax.runtime import sharding

Array = jax.Array


def _check_tokens(tokens: Any, attention_mask: Any) -> Array:
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tokens must be an int [B, T] array, got {tokens.dtype}{tokens.shape}")
    if attention_mask is None:
        return jnp.ones(tokens.shape, dtype=bool)
    if attention_mask.shape != tokens.shape:
        raise ValueError(f"attention_mask shape {attention_mask.shape} != tokens shape "
                         f"{tokens.shape}")
    return attention_mask.astype(bool)


def forward(config: Qwen3Config, options: ModelOptions, params: Any, tokens: Array,
            attention_mask: Array | None = None, *, return_values: bool = False,
            layout: sharding.ShardingSpec = sharding.TRAINING) -> Array | tuple[Array, Array]:
    """Logits of every position.

    tokens: [B, T] int; attention_mask: [B, T] (1 = real token, 0 = padding, left or right);
    positions are counted over real tokens only (left-padded prompts work as in HF `generate`).
    Returns logits [B, T, V] float32, and values [B, T] float32 with `return_values` (needs
    `options.value_head`). Outputs at padding positions are finite but meaningless; token ids
    outside [0, V) are clamped.
    """
    mask = _check_tokens(tokens, attention_mask)
    model = Qwen3(config, options, layout)
    variables = {"params": params}
    hidden, _ = model.apply(variables, tokens, positions_from_mask(mask), mask,
                            method=Qwen3.encode)
    logits = model.apply(variables, hidden, method=Qwen3.logits)
    if not return_values:
        return logits
    return logits, _values(model, variables, hidden, True)


def final_hidden(config: Qwen3Config, options: ModelOptions, params: Any, tokens: Array,
                 attention_mask: Array | None = None, *,
                 layout: sharding.ShardingSpec = sharding.TRAINING) -> Array:
    """The final-normed hidden states [B, T, D] float32 that `forward`'s logits are computed
    from (tokens, attention_mask as in `forward`); the features of heads on the backbone, such
    as the PRM's (`ibpo_jax.methods.prm`). Values at padding positions are finite but
    meaningless."""
    mask = _check_tokens(tokens, attention_mask)
    model = Qwen3(config, options, layout)
    hidden, _ = model.apply({"params": params}, tokens, positions_from_mask(mask), mask,
                            method=Qwen3.encode)
    return hidden.astype(jnp.float32)


class TokenLogprobs(NamedTuple):
    """Per-token statistics aligned with `tokens`: entry [b, t] is about predicting
    tokens[b, t] from tokens[b, :t]. Entries are 0 where nothing real predicts a real token:
    column 0, padding, and the first real token of a left-padded row."""

    logprobs: Array  # [B, T] float32
    entropy: Array | None  # [B, T] float32, entropy of the predictive distribution at t
    values: Array | None  # [B, T] float32, value head on tokens[b, :t+1]


def _stats(logits: Array, targets: Array, with_entropy: bool) -> tuple[Array, Array | None]:
    lse = jax.nn.logsumexp(logits, axis=-1)
    lp = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - lse
    if not with_entropy:
        return lp, None
    probs = jnp.exp(logits - lse[..., None])
    return lp, lse - jnp.sum(probs * logits, axis=-1)


def _next_token_stats(model: Qwen3, variables: Any, h: Array, targets: Array,
                      temperature: float, with_entropy: bool, logits_chunk: int
                      ) -> tuple[Array, Array | None]:
    """Log-probs (and entropies) [B, T] of targets [B, T] under the logits of hidden h
    [B, T, D], in chunks of `logits_chunk` positions (see `token_logprobs`)."""
    def chunk_stats(h_c, t_c):
        logits = model.apply(variables, h_c, method=Qwen3.logits) / temperature
        return _stats(logits, t_c, with_entropy)

    b, t = targets.shape
    if logits_chunk <= 0 or logits_chunk >= t:
        return chunk_stats(h, targets)
    n = -(-t // logits_chunk)
    pad = n * logits_chunk - t
    h_c = jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(b, n, logits_chunk, -1)
    t_c = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, logits_chunk)
    out = jax.lax.map(jax.checkpoint(lambda a: chunk_stats(*a)),
                      (h_c.swapaxes(0, 1), t_c.swapaxes(0, 1)))
    return jax.tree.map(lambda a: a.swapaxes(0, 1).reshape(b, n * logits_chunk)[:, :t], out)


def _dropout_rngs(key: Array | None) -> dict[str, Array] | None:
    """The apply's rngs: the adapters' dropout key (`qwen3.project`), or none."""
    return None if key is None else {DROPOUT_RNG: key}


def _values(model: Qwen3, variables: Any, hidden: Array, wanted: bool) -> Array | None:
    """The value head on hidden [..., D] -> [...] float32, or None when not `wanted`."""
    if not wanted:
        return None
    if not model.options.value_head:
        raise ValueError("return_values=True needs ModelOptions(value_head=True)")
    return model.apply(variables, hidden, method=Qwen3.values)


def token_logprobs(config: Qwen3Config, options: ModelOptions, params: Any, tokens: Array,
                   attention_mask: Array | None = None, *, segment_ids: Array | None = None,
                   temperature: float = 1.0, return_entropy: bool = False,
                   return_values: bool = False, logits_chunk: int = 0,
                   layout: sharding.ShardingSpec = sharding.TRAINING,
                   dropout_key: Array | None = None) -> TokenLogprobs:
    """log softmax(logits / temperature) of each next token, in float32.

    tokens, attention_mask: [B, T]. Packed rows instead give `segment_ids` [B, T] int (0 =
    padding, else the id of the contiguous sequence a token belongs to; no attention_mask):
    attention and positions stay within each sequence, and a sequence's first token gets
    log-prob 0 like column 0. `logits_chunk` > 0 computes the unembedding and log-softmax over
    chunks of that many positions, each rematerialized in the backward pass, so the [B, T, V]
    float32 logits never exist whole (large vocabularies); 0 = in one go. `dropout_key`: the
    LoRA adapters' dropout key (`options.lora_dropout` > 0; the update's gradient passes
    only); None = no dropout.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    model = Qwen3(config, options, layout)
    variables = {"params": params}
    if segment_ids is None:
        mask = _check_tokens(tokens, attention_mask)
        positions, same = positions_from_mask(mask), None
    else:
        if attention_mask is not None:
            raise ValueError("give attention_mask or segment_ids, not both")
        if segment_ids.shape != tokens.shape:
            raise ValueError(f"segment_ids shape {segment_ids.shape} != tokens shape "
                             f"{tokens.shape}")
        mask = _check_tokens(tokens, None) & (segment_ids > 0)
        positions = positions_from_segments(segment_ids)
        same = segment_ids[:, 1:] == segment_ids[:, :-1]
    hidden, _ = model.apply(variables, tokens, positions, mask, segment_ids,
                            method=Qwen3.encode, rngs=_dropout_rngs(dropout_key))
    lp, ent = _next_token_stats(model, variables, hidden[:, :-1], tokens[:, 1:], temperature,
                                return_entropy, logits_chunk)
    b = tokens.shape[0]
    valid = mask[:, 1:] & mask[:, :-1]  # a real target predicted from a real position
    if same is not None:
        valid &= same  # ... of the same sequence
    pad_col = jnp.zeros((b, 1), jnp.float32)
    lp = jnp.concatenate([pad_col, jnp.where(valid, lp, 0.0)], axis=1)
    if ent is not None:
        ent = jnp.concatenate([pad_col, jnp.where(valid, ent, 0.0)], axis=1)
    return TokenLogprobs(lp, ent, _values(model, variables, hidden, return_values))


def response_logprobs(config: Qwen3Config, options: ModelOptions, params: Any, prompt: Array,
                      prompt_len: Array, response: Array, *, temperature: float = 1.0,
                      return_entropy: bool = False, return_values: bool = False,
                      logits_chunk: int = 0,
                      layout: sharding.ShardingSpec = sharding.TRAINING,
                      dropout_key: Array | None = None) -> TokenLogprobs:
    """Per-token statistics of R responses per prompt, each prompt encoded once
    (`dropout_key` as in `token_logprobs`).

    prompt [B, P] int, left-padded to prompt_len [B]; response [B*R, N] int, row b*R + r a
    continuation of prompt b, padding (if any) after its real tokens. Entry [i, j] is about
    response[i, j] given its prompt and response[i, :j]: the log-prob (as `token_logprobs`
    gives it on the concatenated row; entropy likewise), and the value head on the state
    before that token. Entries past a response's own length are finite but meaningless.

    The prompt's layers run once per prompt rather than once per response, the backward pass
    likewise (its gradient is the sum of the R responses'): with R = 8 samples and prompts
    about as long as responses, ~45 % fewer tokens go through the model than on whole rows.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    (b, p), (br, _) = prompt.shape, response.shape
    if br % b or prompt_len.shape != (b,):
        raise ValueError(f"response rows {br} must be a multiple of prompt rows {b}, and "
                         f"prompt_len {prompt_len.shape} must be ({b},)")
    model = Qwen3(config, options, layout)
    variables = {"params": params}
    prompt_mask = jnp.arange(p)[None, :] >= (p - prompt_len)[:, None]
    hp, hr = model.apply(variables, prompt, prompt_mask, response, method=Qwen3.encode_grouped,
                         rngs=_dropout_rngs(dropout_key))
    # Response token j is predicted from the token before it: the prompt's last for j = 0.
    h = jnp.concatenate([jnp.repeat(hp[:, -1:], br // b, axis=0), hr[:, :-1]], axis=1)
    lp, ent = _next_token_stats(model, variables, h, response, temperature, return_entropy,
                                logits_chunk)
    return TokenLogprobs(lp, ent, _values(model, variables, h, return_values))


def make_options(dtype: Any = jnp.float32, **options: Any) -> ModelOptions:
    """ModelOptions with `dtype` for compute and (unless given) for params."""
    options.setdefault("param_dtype", dtype)
    return ModelOptions(dtype=dtype, **options)


def abstract_params(config: Qwen3Config, options: ModelOptions) -> Any:
    """The params pytree as `jax.ShapeDtypeStruct`s, nothing allocated."""
    model = Qwen3(config, options)
    return jax.eval_shape(
        lambda rng: model.init(rng, jnp.zeros((1, 1), jnp.int32), method=Qwen3.init_all)["params"],
        jax.random.key(0))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Qwen3LM:
    """A model with its weights: `m(tokens, attention_mask=mask)` -> float32 logits [B, T, V].

    `mesh`/`layout` say where params live; calls run under `jax.set_mesh(mesh)` with the batch
    split over ("data", "fsdp") when it divides.
    """

    config: Qwen3Config = dataclasses.field(metadata=dict(static=True))
    options: ModelOptions = dataclasses.field(metadata=dict(static=True))
    params: Any
    mesh: Mesh | None = dataclasses.field(default=None, metadata=dict(static=True))
    layout: sharding.ShardingSpec = dataclasses.field(default=sharding.TRAINING,
                                                      metadata=dict(static=True))

    def mesh_context(self) -> contextlib.AbstractContextManager:
        return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    def place_batch(self, x: Any) -> Array:
        """Puts a [B, ...] host array on this model's mesh (batch-split when it divides)."""
        x = jnp.asarray(x) if self.mesh is None else np.asarray(x)
        if self.mesh is None:
            return x
        n = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        spec = P(sharding.BATCH) if x.shape[0] % n == 0 else P()
        return jax.device_put(x, NamedSharding(self.mesh, spec))

    def __call__(self, tokens: Any, attention_mask: Any = None) -> Array:
        tokens = self.place_batch(tokens)
        mask = None if attention_mask is None else self.place_batch(attention_mask)
        with self.mesh_context():
            return _forward_jit(self.config, self.options, self.params, tokens, mask,
                                layout=self.layout)

    def values(self, tokens: Any, attention_mask: Any = None) -> Array:
        """Value head output [B, T] float32."""
        tokens = self.place_batch(tokens)
        mask = None if attention_mask is None else self.place_batch(attention_mask)
        with self.mesh_context():
            return _forward_jit(self.config, self.options, self.params, tokens, mask,
                                return_values=True, layout=self.layout)[1]


_forward_jit = jax.jit(forward, static_argnums=(0, 1), static_argnames=("return_values", "layout"))


def place_params(params: Any, mesh: Mesh | None,
                 layout: sharding.ShardingSpec = sharding.TRAINING) -> Any:
    """Reshards a params pytree onto `mesh` as `layout` declares (no-op without a mesh)."""
    if mesh is None:
        return params
    return jax.device_put(params, sharding.param_shardings(params, mesh, layout))


def init(config: Qwen3Config, rng: Array, *, dtype: Any = jnp.float32, mesh: Mesh | None = None,
         layout: sharding.ShardingSpec = sharding.TRAINING, **options: Any) -> Qwen3LM:
    """A randomly initialized model (normal(initializer_range) weights, unit norm scales).

    `dtype` is the compute and parameter dtype; `options` are the other `ModelOptions` fields
    (param_dtype, remat, scan_layers, value_head). With a mesh, every parameter is created
    directly on its shards.
    """
    opts = make_options(dtype, **options)
    model = Qwen3(config, opts, layout)

    def init_fn(key):
        return model.init(key, jnp.zeros((1, 1), jnp.int32), method=Qwen3.init_all)["params"]

    out_shardings = None
    if mesh is not None:
        out_shardings = sharding.param_shardings(jax.eval_shape(init_fn, rng), mesh, layout)
    params = jax.jit(init_fn, out_shardings=out_shardings)(rng)
    return Qwen3LM(config, opts, params, mesh, layout)
