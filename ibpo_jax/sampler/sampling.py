"""Batched autoregressive sampling with a KV cache: jitted prefill, then `lax.while_loop` decode.

Prompts are right-aligned (left-padded) [B, P] int32 with their lengths [B]. The prompt is
encoded once per prompt; its keys/values form the shared prompt part of the cache, which the
R = `num_samples` continuations of that prompt all attend to (no R-fold prefill, no R-fold copy
of the prompt cache). Each continuation row has its own row cache, updated in place inside
the loop; it grows by static widths between segments of the loop, so that a step's attention
reads the slots filled so far rounded up to a width, not all `max_new_tokens`
(`kv_cache.slot_widths`). Output rows are prompt-major: row b*R + r is sample r of prompt b.

Per-token log-probs are those of the distribution actually sampled from: log softmax of
logits / temperature, renormalized over the top-k / top-p set when those filters are on. With
top_k=0 and top_p=1 that is exactly what `models.token_logprobs(..., temperature=t)`
recomputes (what RL needs as log pi_old). Greedy decoding (temperature 0) reports the model's
untempered log-probs of the chosen tokens.

Each row also carries the sum over its tokens of the policy's entropy at temperature 1
(`numerics.entropy` of the same logits, no extra pass): evaluation's `eval_entropy`.

Rows stop at their first EOS (counted in `lengths`; later tokens are `pad_id` with log-prob 0);
the loop exits as soon as every row is done. Between legs of the loop (`kv_cache.decode_stops`:
each segment width, and within one every width / 8 steps, at most `COMPACT_EVERY`) finished
rows are dropped from the batch: the active ones are gathered into the smallest of a few row
counts (`kv_cache.bucket_sizes`), each with its own copy of its prompt's cache part, and
written back into the outputs at the end. Row i always draws the i-th of the step's B*R
uniforms, whichever rows are active, so compaction draws the same samples; its log-probs
equal the uncompacted ones up to float rounding (XLA:CPU orders decode attention's sums by
the row count), so a token can differ only where a uniform falls within rounding of a
boundary of the inverse CDF. Sampling is deterministic for a given key.

Decode reads a copy of the weights in the compute dtype (`compute_weights`), made once per
call and placed as the sampler's layout says (`sharding.SAMPLING` by default, replicated over
the batch axes; `sharding.SAMPLING_FSDP` for weights too big for that).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ibpo_jax.core.numerics import entropy
from ibpo_jax.models import kv_cache
from ibpo_jax.models.config import ModelOptions, Qwen3Config
from ibpo_jax.models.lm import Qwen3LM
from ibpo_jax.models.qwen3 import Qwen3, positions_from_mask
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler.strategies import (  # noqa: F401  (re-exported: the sampler's strategy API)
    Categorical,
    Greedy,
    TopK,
    TopP,
    inverse_cdf,
    make_strategy,
    sample_inverse_cdf,
)

Array = jax.Array


class SampleOutput(NamedTuple):
    tokens: Array  # [B*R, N] int32, pad_id after each row's length
    lengths: Array  # [B*R] int32, generated tokens including the EOS token
    logprobs: Array  # [B*R, N] float32, 0 past each row's length
    # [B*R] float32: Σ over each row's tokens of the policy's entropy at temperature 1
    # (`numerics.entropy` of the logits it sampled from); None from hand-built outputs.
    entropy: Array | None = None


# ---------------------------------------------------------------- weights


def _narrowed(path: Any, x: Any, dtype: Any) -> bool:
    """Whether `compute_weights` casts the leaf `x` at `path` to `dtype`: a matrix (not a
    `sharding.PARAM_FIELDS` "vector") whose dtype is wider."""
    field = sharding.PARAM_FIELDS.get(str(getattr(path[-1], "key", path[-1])))
    return field != "vector" and jnp.dtype(x.dtype).itemsize > jnp.dtype(dtype).itemsize


def compute_weights(params: Any, dtype: Any) -> Any:
    """`params` with every weight matrix (projections, embedding, lm_head) cast to the compute
    `dtype` where that is narrower than its own; vectors (norm scales, value head) keep theirs.
    The model casts matrices to the compute dtype before every matmul and reads vectors in
    float32, so results are bit-identical, and a bf16 copy of fp32 weights reads half the
    bytes. Leaves that need no cast are returned as they are (not copied)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x.astype(dtype) if _narrowed(path, x, dtype) else x, params)


def _casts(params: Any, dtype: Any) -> bool:
    """Whether `compute_weights(params, dtype)` casts anything (host check, no tracing)."""
    return any(_narrowed(p, x, dtype) for p, x in jax.tree_util.tree_leaves_with_path(params))


# ---------------------------------------------------------------- decode state and loop

COMPACT_EVERY = 512  # decode steps between chances to drop finished rows, within a width
# Compaction's default: on from this many new tokens. Short responses gain little (6.9 % of
# the row-steps at arith_tiny's 48 tokens, measured) against the extra compiled programs (a
# segment per width and row count); 8,192-token ones ~30-46 % (kv_cache.row_steps).
COMPACT_MIN_NEW_TOKENS = 512


class DecodeState(NamedTuple):
    """The loop's state over its M active rows (M = B*R until finished rows are dropped)."""

    step: Array  # int32: tokens[:, step] is the newest sampled token
    cache: kv_cache.KVCache  # row cache: the current segment's width (kv_cache.grow)
    tokens: Array  # [M, N] int32
    logprobs: Array  # [M, N] float32
    lengths: Array  # [M] int32
    done: Array  # [M] bool: EOS already emitted
    prompt_mask: Array  # [B, P] bool (shared by R rows each), [M, P] once compacted
    next_pos: Array  # [M] int32: position of tokens[:, step]
    row_ids: Array  # [M] int32: each row's output row; B*R on a compacted batch's padding
    rng: Array
    entropy: Array  # [M] float32: Σ entropy (temperature 1) of the row's tokens so far


@dataclasses.dataclass(frozen=True)
class _Sampler:
    config: Qwen3Config
    options: ModelOptions
    max_new_tokens: int
    strategy: Greedy | Categorical
    eos_ids: tuple[int, ...]
    num_samples: int
    pad_id: int
    mesh: Mesh | None
    layout: sharding.ShardingSpec = sharding.SAMPLING
    compaction: bool = True

    @property
    def model(self) -> Qwen3:
        return Qwen3(self.config, self.options, self.layout)

    def _params(self, params: Any) -> Any:
        if self.mesh is None:
            return params
        shardings = sharding.param_shardings(params, self.mesh, self.layout)
        return jax.lax.with_sharding_constraint(params, shardings)

    def weights(self, params: Any) -> Any:
        """The weights decode reads: the compute-dtype copy, in the sampling layout."""
        return self._params(compute_weights(params, self.options.dtype))

    def _pick(self, logits: Array, rng: Array, step: Array, done: Array, row_ids: Array,
              total: int) -> tuple[Array, Array, Array]:
        """(tokens, their log-probs, the entropy at temperature 1) per row [M]; pad_id, 0, 0
        on rows already done."""
        if isinstance(self.strategy, Greedy):
            tokens, logp = self.strategy(logits, rng)
        else:
            # Row i draws the i-th of `total` uniforms whatever rows are active (the same
            # numbers as one draw for the whole batch): dropping rows changes no sample.
            u = jax.random.uniform(jax.random.fold_in(rng, step), (total, 1))
            tokens, logp = self.strategy.sample(logits, u[jnp.minimum(row_ids, total - 1)])
        return (jnp.where(done, self.pad_id, tokens).astype(jnp.int32),
                jnp.where(done, 0.0, logp), jnp.where(done, 0.0, entropy(logits)))

    def _is_eos(self, tokens: Array) -> Array:
        if not self.eos_ids:
            return jnp.zeros(tokens.shape, bool)
        return jnp.isin(tokens, jnp.asarray(self.eos_ids, jnp.int32))

    def prefill(self, params: Any, prompts: Array, prompt_lens: Array, rng: Array
                ) -> DecodeState:
        b, p = prompts.shape
        r, n, c = self.num_samples, self.max_new_tokens, self.config
        params = self._params(params)
        mask = jnp.arange(p)[None, :] >= (p - prompt_lens)[:, None]
        hidden, kv = self.model.apply({"params": params}, prompts, positions_from_mask(mask),
                                      mask, method=Qwen3.encode)
        logits = self.model.apply({"params": params}, hidden[:, -1], method=Qwen3.logits)
        logits = jnp.repeat(logits, r, axis=0)  # prompt-major rows b*R + r
        ids = jnp.arange(b * r, dtype=jnp.int32)
        first, logp, ent = self._pick(logits, rng, jnp.int32(0), jnp.zeros((b * r,), bool),
                                      ids, b * r)
        # Token i's key/value go to slot i when token i is fed; the last token is never fed.
        # The row cache starts at the first segment's width and grows (see `decode`).
        width = kv_cache.slot_widths(max(n - 1, 1))[0]
        stacked = self.options.scan_layers
        rows = kv_cache.empty_rows(b * r, width, c.num_hidden_layers, c.num_key_value_heads,
                                   c.head_dim, self.options.dtype, stacked)
        cache = self._place(kv_cache.KVCache(kv_cache.prompt_cache(kv, stacked), rows))
        tokens = jnp.full((b * r, n), self.pad_id, jnp.int32).at[:, 0].set(first)
        return DecodeState(
            step=jnp.int32(0), cache=cache, tokens=tokens,
            logprobs=jnp.zeros((b * r, n), jnp.float32).at[:, 0].set(logp),
            lengths=jnp.ones((b * r,), jnp.int32), done=self._is_eos(first), prompt_mask=mask,
            next_pos=jnp.repeat(prompt_lens.astype(jnp.int32), r), row_ids=ids, rng=rng,
            entropy=ent)

    def _place(self, cache: kv_cache.KVCache) -> kv_cache.KVCache:
        """Sharding constraints of the cache's arrays (keys [.., B, K, H, S], values
        [.., B, K, S, H]; a leading [L] axis when stacked)."""
        k_spec, v_spec = self.layout.cache_bkhs, self.layout.cache_bksh
        if self.options.scan_layers:
            k_spec, v_spec = (P(None, *s) for s in (k_spec, v_spec))

        def place(kv: Any) -> Any:
            return type(kv)(sharding.constrain(kv.k, k_spec), sharding.constrain(kv.v, v_spec))

        leaf = lambda x: isinstance(x, (kv_cache.PromptKV, kv_cache.RowKV))  # noqa: E731
        return jax.tree.map(place, cache, is_leaf=leaf)

    def _step(self, params: Any, total: int, s: DecodeState) -> DecodeState:
        """Feeds tokens[:, step] (row-cache slot `step`) and samples tokens[:, step + 1]."""
        fed = jax.lax.dynamic_index_in_dim(s.tokens, s.step, axis=1, keepdims=False)
        slots = kv_cache.slots_of(s.cache.rows)
        hidden, cache = self.model.apply(
            {"params": params}, fed, s.next_pos, s.cache, s.prompt_mask,
            jnp.arange(slots) <= s.step, s.step, method=Qwen3.decode)
        logits = self.model.apply({"params": params}, hidden, method=Qwen3.logits)
        tok, logp, ent = self._pick(logits, s.rng, s.step + 1, s.done, s.row_ids, total)
        col = s.step + 1
        return s._replace(
            step=col, cache=cache,
            tokens=jax.lax.dynamic_update_index_in_dim(s.tokens, tok, col, axis=1),
            logprobs=jax.lax.dynamic_update_index_in_dim(s.logprobs, logp, col, axis=1),
            lengths=s.lengths + (~s.done).astype(jnp.int32),
            done=s.done | self._is_eos(tok), next_pos=s.next_pos + 1, entropy=s.entropy + ent)

    def segment(self, params: Any, state: DecodeState, stop: Array, total: int
                ) -> DecodeState:
        """Decode steps while the step is below `stop` (<= the row cache's width), below the
        last column, and some row is not done: one leg of the loop, see `_compiled`. `total`:
        the batch's B*R rows (static)."""
        params = self._params(params)
        n = self.max_new_tokens

        def cond(s: DecodeState) -> Array:
            return (s.step < stop) & (s.step + 1 < n) & ~jnp.all(s.done)

        # Returning the whole (donated) state lets the loop update its buffers, the cache
        # above all, in place instead of copying them.
        return jax.lax.while_loop(cond, functools.partial(self._step, params, total), state)

    def grow(self, state: DecodeState, width: int) -> DecodeState:
        """The state with its row cache padded to `width` slots; consumes the old row cache
        (`kv_cache.grow_consumed`), the rest is passed on uncopied."""
        rows = kv_cache.grow_consumed(state.cache.rows, width)
        return state._replace(cache=state.cache._replace(rows=rows))

    def merge(self, out: SampleOutput, state: DecodeState) -> SampleOutput:
        """The outputs [B*R, ...] with the state's rows written at their `row_ids`."""
        put = lambda full, part: sharding.constrain(  # noqa: E731
            full.at[state.row_ids].set(part, mode="drop"), P(sharding.BATCH))
        return SampleOutput(put(out.tokens, state.tokens), put(out.lengths, state.lengths),
                            put(out.logprobs, state.logprobs), put(out.entropy, state.entropy))

    def compact(self, out: SampleOutput | None, state: DecodeState, keep: Array, width: int,
                total: int) -> tuple[SampleOutput, DecodeState]:
        """Drops finished rows: (the outputs so far, the state of rows `keep` [M'] (indices
        into the state's rows; -1: padding, a done row whose results are dropped) with its
        row cache grown to `width`). `out` None: the state is the uncompacted prefill's (its
        prompt cache shared by R rows each), and its arrays are the outputs so far."""
        if out is None:
            out, shared = SampleOutput(state.tokens, state.lengths, state.logprobs,
                                       state.entropy), True
        else:
            out, shared = self.merge(out, state), False
        pad = keep < 0
        idx = jnp.maximum(keep, 0)
        ids = state.row_ids[idx]
        prompt = ids // self.num_samples if shared else idx  # each row its prompt's part
        stacked = self.options.scan_layers
        take = lambda x: sharding.constrain(jnp.take(x, idx, axis=0), P(sharding.BATCH))  # noqa
        cache = kv_cache.KVCache(
            kv_cache.take_rows(state.cache.prompt, prompt, stacked),
            kv_cache.grow(kv_cache.take_rows(state.cache.rows, idx, stacked), width))
        return out, state._replace(
            cache=self._place(cache), tokens=take(state.tokens), logprobs=take(state.logprobs),
            lengths=take(state.lengths), done=take(state.done) | pad, entropy=take(state.entropy),
            prompt_mask=sharding.constrain(state.prompt_mask[prompt], P(sharding.BATCH)),
            next_pos=take(state.next_pos), row_ids=jnp.where(pad, total, ids))


GenerateFn = Callable[[Any, Any, Any, Array], SampleOutput]


def generate_fn(config: Qwen3Config, options: ModelOptions, *, max_new_tokens: int,
                temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                eos_ids: tuple[int, ...] | list[int] = (), num_samples: int = 1,
                pad_id: int = 0, mesh: Mesh | None = None,
                layout: sharding.ShardingSpec = sharding.SAMPLING,
                compact: bool | None = None) -> GenerateFn:
    """A function (params, prompts [B, P], prompt_lens [B], rng) -> SampleOutput.

    Built once per configuration (cached): repeated calls with new params or new prompts of
    the same shapes reuse the compiled programs: `fn.weights` (params) -> the compute-dtype
    copy in `layout`, made once per call; `fn.prefill` (weights, prompts, prompt_lens, rng)
    -> DecodeState; `fn.decode` (weights, state) -> SampleOutput (the state consumed). With a
    mesh, rows are split over ("data", "fsdp") and weights take `layout` (`sharding.SAMPLING`:
    replicated over the batch axes; `sharding.SAMPLING_FSDP`: split over fsdp, gathered per
    layer). `compact`: drop finished rows between legs of the loop (the same samples, fewer
    row-steps); None: from `COMPACT_MIN_NEW_TOKENS` new tokens on.
    """
    if isinstance(max_new_tokens, bool) or int(max_new_tokens) != max_new_tokens \
            or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens}")
    if int(num_samples) != num_samples or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples}")
    if top_k > config.vocab_size:
        raise ValueError(f"top_k={top_k} exceeds the vocabulary size {config.vocab_size}")
    return _compiled(_Sampler(config, options, int(max_new_tokens),
                              make_strategy(temperature=temperature, top_k=top_k, top_p=top_p),
                              tuple(int(e) for e in eos_ids), int(num_samples), int(pad_id),
                              mesh, layout, bool(max_new_tokens >= COMPACT_MIN_NEW_TOKENS
                                                 if compact is None else compact)))


class _Programs(NamedTuple):
    """The sampler's jitted programs (one compilation per shape: width, row count)."""

    weights: Callable
    prefill: Callable
    segment: Callable
    compact: Callable
    merge: Callable


def _replicated(mesh: Mesh | None, x: Any) -> Any:
    return x if mesh is None else sharding.global_array(x, NamedSharding(mesh, P()))


def _decode(sampler: _Sampler, progs: _Programs, params: Any, state: DecodeState
            ) -> SampleOutput:
    """The decode loop in legs (`kv_cache.decode_stops`): segments of growing row-cache
    widths (`kv_cache.slot_widths`), one compiled program per width and row count, the
    cache grown between them, so a step's attention reads the slots filled so far rounded
    up to a width, not all max_new_tokens - 1. Between legs (one host read of `done`),
    finished rows are dropped into a smaller bucket when the active ones fit one; once
    every row is done the later legs are skipped."""
    mesh = sampler.mesh
    legs = kv_cache.decode_stops(kv_cache.slot_widths(max(sampler.max_new_tokens - 1, 1)),
                                 COMPACT_EVERY if sampler.compaction else 0)
    total = state.row_ids.shape[0]
    devices = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
    sizes = kv_cache.bucket_sizes(total, devices if total % devices == 0 else 1)
    out = None
    for i, (stop, width) in enumerate(legs):
        if i:
            done = sharding.host_array(state.done)
            if done.all():
                break
            active = np.flatnonzero(~done)
            m = min(x for x in sizes if x >= len(active))
            if sampler.compaction and m < len(done):
                keep = np.concatenate([active, np.full(m - len(active), -1)])
                out, state = progs.compact(out, state, _replicated(mesh, keep.astype(np.int32)),
                                           max(width, kv_cache.slots_of(state.cache.rows)), total)
        if width > kv_cache.slots_of(state.cache.rows):
            state = sampler.grow(state, width)
        state = progs.segment(params, state, _replicated(mesh, np.int32(stop)), total)
    if out is None:
        return SampleOutput(state.tokens, state.lengths, state.logprobs, state.entropy)
    return progs.merge(out, state)


@functools.lru_cache(maxsize=32)
def _compiled(sampler: _Sampler) -> GenerateFn:
    progs = _Programs(
        weights=jax.jit(sampler.weights), prefill=jax.jit(sampler.prefill),
        segment=jax.jit(sampler.segment, donate_argnums=1, static_argnums=3),
        compact=jax.jit(sampler.compact, donate_argnums=0, static_argnums=(3, 4)),
        merge=jax.jit(sampler.merge, donate_argnums=0))
    mesh = sampler.mesh
    decode = functools.partial(_decode, sampler, progs)

    def shared(params: Any) -> Any:
        """What decode reads: the compute-dtype copy in the sampling layout (no copy of
        float32 weights without a mesh, where nothing would change)."""
        if mesh is None and not _casts(params, sampler.options.dtype):
            return params
        return progs.weights(params)

    def run(params: Any, prompts: Any, prompt_lens: Any, rng: Array, *,
            cast: Any = None) -> SampleOutput:
        # cast: `run.weights(params)` made by the caller, to share one copy between several
        # calls of one rollout (prompts sampled in chunks).
        if mesh is None:
            prompts = jnp.asarray(prompts, jnp.int32)
            prompt_lens = jnp.asarray(prompt_lens, jnp.int32)
            w = cast if cast is not None else shared(params)
            return decode(w, progs.prefill(w, prompts, prompt_lens, rng))
        # Rows split over the batch axes when they divide evenly, else replicated; host
        # values are the same on every process.
        split = np.shape(prompts)[0] % (mesh.shape["data"] * mesh.shape["fsdp"]) == 0
        place = lambda x, ndim: sharding.global_array(  # noqa: E731
            np.asarray(x, np.int32),
            sharding.batch_sharding(mesh, ndim) if split else NamedSharding(mesh, P()))
        prompts, prompt_lens = place(prompts, 2), place(prompt_lens, 1)
        with jax.set_mesh(mesh):
            w = cast if cast is not None else shared(params)
            return decode(w, progs.prefill(w, prompts, prompt_lens, rng))

    run.weights, run.shared, run.prefill, run.decode = progs.weights, shared, progs.prefill, decode
    run.sampler = sampler  # its settings (`refill.refill_fn` builds on them)
    return run


def generate(m: Qwen3LM, prompts: Any, prompt_lens: Any, *, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
             eos_ids: tuple[int, ...] | list[int] = (), rng: Array, num_samples: int = 1,
             pad_id: int = 0) -> SampleOutput:
    """Samples `num_samples` continuations of each prompt (see the module docstring).

    prompts: [B, P] int, right-aligned (left padding); prompt_lens: [B] int in [1, P].
    Returns SampleOutput(tokens [B*R, N], lengths [B*R], logprobs [B*R, N]).
    """
    prompts_np, lens_np = np.asarray(prompts), np.asarray(prompt_lens)
    if prompts_np.ndim != 2 or not np.issubdtype(prompts_np.dtype, np.integer):
        raise ValueError(f"prompts must be an int [B, P] array, got "
                         f"{prompts_np.dtype}{prompts_np.shape}")
    if lens_np.shape != prompts_np.shape[:1]:
        raise ValueError(f"prompt_lens shape {lens_np.shape} != ({prompts_np.shape[0]},)")
    if lens_np.size and (lens_np.min() < 1 or lens_np.max() > prompts_np.shape[1]):
        raise ValueError(f"prompt_lens must be in [1, {prompts_np.shape[1]}], got "
                         f"{lens_np.min()}..{lens_np.max()}")
    if prompts_np.size and (prompts_np.min() < 0 or prompts_np.max() >= m.config.vocab_size):
        raise ValueError(f"prompt token ids must be in [0, {m.config.vocab_size})")
    fn = generate_fn(m.config, m.options, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_p=top_p, top_k=top_k, eos_ids=eos_ids,
                     num_samples=num_samples, pad_id=pad_id, mesh=m.mesh)
    return fn(m.params, prompts_np, lens_np, rng)


__all__ = ["Categorical", "DecodeState", "GenerateFn", "Greedy", "SampleOutput", "TopK", "TopP",
           "generate", "generate_fn", "inverse_cdf", "make_strategy", "sample_inverse_cdf"]
