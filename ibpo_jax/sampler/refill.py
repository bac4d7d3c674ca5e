"""Slot refill (issue 59): the B*R rows of a sampler call form a queue, and decode keeps `slots`
rows busy: when a row ends, its slot takes the next waiting row, instead of idling until the
longest row of its chunk ends. At long, skewed lengths (a wrong answer often runs to the
limit, a right one stops early) a step then costs about total tokens / slots decode steps
rather than chunks x longest.

Same samples as the one-pass sampler (`sampling.generate_fn`) for the same key: row i's token
t is drawn with the i-th of the B*R uniforms of fold_in(rng, t), whichever slot holds the row
and whenever it runs. Log-probs equal the one-pass ones up to float rounding (the decode batch
is another, as with compaction), so a token can differ only where a uniform falls within
rounding of a boundary of the inverse CDF.

A column per row. Rows in the slots started at different decode steps, so each writes its
token's key/value at its own column (`kv_cache.write` with a slot per row) and attends to its
columns so far (a mask per row, `attention.decode_attention`). The call's prompts are encoded
once, up front, as in the one-pass sampler (`start`: their keys/values and last logits), and a
slot reads its row's prompt from that store (`Qwen3.decode`'s `prompt_rows`): no slot holds a
copy, and no prompt is encoded twice. The row cache grows by the one-pass sampler's static
widths (`kv_cache.slot_widths`) as the longest live row needs them.

What a step costs beyond the one-pass sampler's: each slot reads its own prompt's keys/values
(gathered from the store, where rows sharing a prompt read it once), and every slot reads the
cache as wide as the longest live row (a refilled row's later columns masked). Where prompts
are short next to the responses, as at the paper's lengths, those are small; on XLA:CPU at
`arith_long`'s lengths they make refill slower in wall time despite fewer decode steps
(experiments/benchmarks/RESULTS.md).

Loop. On the host: `refill` fills `block` free slots with the next rows of the queue (one
jitted program of fixed shape: draw their first tokens from their prompts' logits, scatter
them into the slots; a row past the queue's end leaves its slot empty), after `merge` has
written the finished rows of those slots into the [B*R, N] outputs. Then `segment` decodes on
device (`lax.while_loop`) until at least `block` slots are free (with the queue empty: all),
or a live row reaches the cache's width, which then grows. One compiled program per width,
none per refill; one read from the device per leg. Axis letters as in `sampling.py`; S slots,
F the refill block, W the cache's width.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ibpo_jax.core.numerics import entropy
from ibpo_jax.models import kv_cache
from ibpo_jax.models.qwen3 import Qwen3, positions_from_mask
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import sampling
from ibpo_jax.sampler.strategies import Greedy

Array = jax.Array


class RefillState(NamedTuple):
    """The decode state of S slots, each holding one row of the queue (or none)."""

    step: Array  # int32: decode steps so far
    cache: kv_cache.KVCache  # prompt part [B, K, H, P] (the call's prompts), rows [S, K, H, W]
    first_logits: Array  # [B, V] float32: each prompt's next-token logits (first tokens)
    prompt_masks: Array  # [B, P] bool: the prompts' real tokens
    tokens: Array  # [S, N] int32: the slot's row so far; tokens[:, col] the newest
    logprobs: Array  # [S, N] float32
    lengths: Array  # [S] int32
    done: Array  # [S] bool: EOS emitted
    col: Array  # [S] int32: the column of the newest sampled token
    prompt_ids: Array  # [S] int32: the slot's prompt (its row // R)
    prompt_mask: Array  # [S, P] bool: the slot's prompt's
    next_pos: Array  # [S] int32: position of tokens[:, col]
    row_ids: Array  # [S] int32: the slot's row in the outputs; B*R for an empty slot
    rng: Array
    entropy: Array  # [S] float32


class RefillStats(NamedTuple):
    """What a call's decode loop ran: decode steps x slots, and the slot-steps that decoded no
    row's token (finished or empty slots)."""

    decode_steps: int
    slot_steps: int
    wasted_slot_steps: int


@dataclasses.dataclass(frozen=True)
class _Refill:
    base: sampling._Sampler  # model, strategy, EOS, pad, mesh and layout
    slots: int  # S
    block: int  # F: slots refilled at once

    @property
    def widths(self) -> tuple[int, ...]:
        """The row cache's widths (the one-pass sampler's): column i's key/value at slot i."""
        return kv_cache.slot_widths(max(self.base.max_new_tokens - 1, 1))

    def finished(self, s: RefillState, total: int) -> Array:
        """[S] bool: slots with no token left to decode (EOS, full, or empty)."""
        return s.done | (s.col + 1 >= self.base.max_new_tokens) | (s.row_ids >= total)

    def _uniforms(self, rng: Array, cols: Array, rows: Array, total: int) -> Array:
        """[M, 1]: row `rows[m]`'s uniform for its token at column `cols[m]`, the one the
        one-pass sampler draws for it (the row's entry of B*R draws of fold_in(rng, col)).
        M x B*R draws a step to keep one of each: small next to a decode step's matmuls."""
        def one(col: Array, row: Array) -> Array:
            u = jax.random.uniform(jax.random.fold_in(rng, col), (total, 1))
            return u[jnp.minimum(row, total - 1)]
        return jax.vmap(one)(cols, rows)

    def _pick(self, logits: Array, rng: Array, cols: Array, rows: Array, idle: Array,
              total: int) -> tuple[Array, Array, Array]:
        strategy, b = self.base.strategy, self.base
        if isinstance(strategy, Greedy):
            tokens, logp = strategy(logits, rng)
        else:
            tokens, logp = strategy.sample(logits, self._uniforms(rng, cols, rows, total))
        return (jnp.where(idle, b.pad_id, tokens).astype(jnp.int32), jnp.where(idle, 0.0, logp),
                jnp.where(idle, 0.0, entropy(logits)))

    def start(self, params: Any, prompts: Array, prompt_lens: Array, rng: Array, total: int
              ) -> RefillState:
        """The call's prompts [B, P] (right-aligned, lengths [B]) encoded, and S empty slots
        (every row id B*R)."""
        b, c, s, n = self.base, self.base.config, self.slots, self.base.max_new_tokens
        params = b._params(params)
        p = prompts.shape[1]
        mask = jnp.arange(p)[None, :] >= (p - prompt_lens)[:, None]
        hidden, kv = b.model.apply({"params": params}, prompts, positions_from_mask(mask), mask,
                                   method=Qwen3.encode)
        logits = b.model.apply({"params": params}, hidden[:, -1], method=Qwen3.logits)
        rows = kv_cache.empty_rows(s, self.widths[0], c.num_hidden_layers,
                                   c.num_key_value_heads, c.head_dim, b.options.dtype,
                                   b.options.scan_layers)
        cache = kv_cache.KVCache(kv_cache.prompt_cache(kv, b.options.scan_layers), rows)
        batch = lambda x: sharding.constrain(x, P(sharding.BATCH))  # noqa: E731
        zeros = lambda dtype: batch(jnp.zeros((s,), dtype))  # noqa: E731
        return RefillState(
            step=jnp.int32(0), cache=b._place(cache), first_logits=logits, prompt_masks=mask,
            tokens=batch(jnp.full((s, n), b.pad_id, jnp.int32)),
            logprobs=batch(jnp.zeros((s, n), jnp.float32)), lengths=zeros(jnp.int32),
            done=zeros(bool), col=zeros(jnp.int32), prompt_ids=zeros(jnp.int32),
            prompt_mask=batch(jnp.zeros((s, p), bool)), next_pos=zeros(jnp.int32),
            row_ids=batch(jnp.full((s,), total, jnp.int32)), rng=rng,
            entropy=zeros(jnp.float32))

    def refill(self, state: RefillState, slots: Array, rows: Array, total: int
               ) -> RefillState:
        """Slots `slots` [F] take rows `rows` [F] (B*R: none): their first tokens drawn from
        their prompts' logits with the rows' own uniforms."""
        b, n = self.base, self.base.max_new_tokens
        prompt = jnp.minimum(rows, total - 1) // b.num_samples
        first, logp, ent = self._pick(state.first_logits[prompt], state.rng,
                                      jnp.zeros_like(rows), rows, rows >= total, total)
        mask = state.prompt_masks[prompt]
        at = lambda x, v: x.at[slots].set(v)  # noqa: E731
        return state._replace(
            tokens=at(state.tokens, jnp.full((len(rows), n), b.pad_id, jnp.int32)
                      .at[:, 0].set(first)),
            logprobs=at(state.logprobs, jnp.zeros((len(rows), n), jnp.float32)
                        .at[:, 0].set(logp)),
            lengths=at(state.lengths, 1), done=at(state.done, b._is_eos(first)),
            col=at(state.col, 0), prompt_ids=at(state.prompt_ids, prompt),
            prompt_mask=at(state.prompt_mask, mask),
            next_pos=at(state.next_pos, jnp.sum(mask, axis=1, dtype=jnp.int32)),
            row_ids=at(state.row_ids, rows.astype(jnp.int32)), entropy=at(state.entropy, ent))

    def _step(self, params: Any, total: int, s: RefillState) -> RefillState:
        """Feeds each slot's newest token (at its column of the row cache) and samples its
        next one."""
        b, n = self.base, self.base.max_new_tokens
        idle = self.finished(s, total)
        ar = jnp.arange(self.slots)
        fed = s.tokens[ar, jnp.minimum(s.col, n - 1)]
        width = kv_cache.slots_of(s.cache.rows)
        # An idle slot's position may be one past the RoPE table (a full row) and its column
        # past the cache: any in-range ones will do, its results are dropped.
        pos, col = jnp.where(idle, 0, s.next_pos), jnp.where(idle, 0, s.col)
        hidden, cache = b.model.apply(
            {"params": params}, fed, pos, s.cache, s.prompt_mask,
            jnp.arange(width)[None, :] <= col[:, None], col, s.prompt_ids,
            method=Qwen3.decode)
        logits = b.model.apply({"params": params}, hidden, method=Qwen3.logits)
        col = s.col + 1
        tok, logp, ent = self._pick(logits, s.rng, col, s.row_ids, idle, total)
        where = jnp.where(idle, n, col)  # idle slots write nothing (dropped)
        live = (~idle).astype(jnp.int32)
        return s._replace(
            step=s.step + 1, cache=cache,
            tokens=s.tokens.at[ar, where].set(tok, mode="drop"),
            logprobs=s.logprobs.at[ar, where].set(logp, mode="drop"),
            lengths=s.lengths + live, done=s.done | (~idle & b._is_eos(tok)),
            col=s.col + live, next_pos=s.next_pos + live, entropy=s.entropy + ent)

    def segment(self, params: Any, state: RefillState, want: Array, total: int
                ) -> tuple[RefillState, tuple[Array, Array, Array]]:
        """Decode steps until at least `want` slots are finished (or all are), or a live row's
        next column is past the cache's width; also what the host reads after it: which slots
        are finished [S], their columns [S], and the slot-steps that decoded nothing."""
        params = self.base._params(params)
        width = kv_cache.slots_of(state.cache.rows)

        def cond(carry: tuple[RefillState, Array]) -> Array:
            fin = self.finished(carry[0], total)
            room = jnp.max(jnp.where(fin, 0, carry[0].col)) < width
            return (jnp.sum(fin) < want) & ~jnp.all(fin) & room

        def body(carry: tuple[RefillState, Array]) -> tuple[RefillState, Array]:
            s, wasted = carry
            return self._step(params, total, s), wasted + jnp.sum(self.finished(s, total))

        state, wasted = jax.lax.while_loop(cond, body, (state, jnp.int32(0)))
        return state, (self.finished(state, total), state.col, wasted)

    def grow(self, state: RefillState, width: int) -> RefillState:
        """The state with its row cache padded to `width` slots (the old one consumed)."""
        rows = kv_cache.grow_consumed(state.cache.rows, width)
        return state._replace(cache=state.cache._replace(rows=rows))

    def merged_refill(self, out: sampling.SampleOutput, state: RefillState, slots: Array,
                      rows: Array, total: int) -> tuple[sampling.SampleOutput, RefillState]:
        """`merge` the rows of slots `slots`, then `refill` them with rows `rows`: one program
        per refill."""
        return self.merge(out, state, slots), self.refill(state, slots, rows, total)

    def merge(self, out: sampling.SampleOutput, state: RefillState, slots: Array
              ) -> sampling.SampleOutput:
        """The outputs [B*R, ...] with slots `slots`' rows written at their row ids."""
        ids = state.row_ids[slots]
        put = lambda full, part: sharding.constrain(  # noqa: E731
            full.at[ids].set(part[slots], mode="drop"), P(sharding.BATCH))
        return sampling.SampleOutput(put(out.tokens, state.tokens),
                                     put(out.lengths, state.lengths),
                                     put(out.logprobs, state.logprobs),
                                     put(out.entropy, state.entropy))


class _Programs(NamedTuple):
    start: Any
    refill: Any
    segment: Any
    merge: Any


def _loop(r: _Refill, progs: _Programs, params: Any, prompts: np.ndarray,
          prompt_lens: np.ndarray, rng: Array, count: int | None
          ) -> tuple[sampling.SampleOutput, RefillStats]:
    """The host's loop (module docstring) over the queue of B*R rows, prompt-major, or its
    first `count` rows (the others' outputs left empty): one read from the device per leg
    (`segment`'s finished slots, columns and waste)."""
    mesh, samples = r.base.mesh, r.base.num_samples
    total, n = len(prompt_lens) * samples, r.base.max_new_tokens
    count = total if count is None else count
    rep = (lambda x: x) if mesh is None else (
        lambda x: sharding.global_array(x, NamedSharding(mesh, P())))
    state = progs.start(params, rep(prompts), rep(prompt_lens), rng, total)
    out = sampling.SampleOutput(
        rep(np.full((total, n), r.base.pad_id, np.int32)), rep(np.zeros(total, np.int32)),
        rep(np.zeros((total, n), np.float32)), rep(np.zeros(total, np.float32)))
    # What the host knows of the slots: finished (empty, at first) and columns. A row refilled
    # here may end at its first token: the next leg's read says so.
    fin, col = np.ones(r.slots, bool), np.zeros(r.slots, np.int64)
    queued, wasted = 0, 0
    while True:
        free = np.flatnonzero(fin)
        while queued < count and len(free) >= r.block:
            slots, free = free[:r.block], free[r.block:]
            rows = np.arange(queued, queued + r.block)
            rows = np.where(rows < count, rows, total).astype(np.int32)
            queued += r.block
            out, state = progs.refill(out, state, rep(slots.astype(np.int32)), rep(rows),
                                      total)
            fin[slots], col[slots] = rows >= total, 0
        if queued >= count and fin.all():
            break
        # The cache's width for the longest live row's next column.
        need = int(col[~fin].max(initial=0)) + 1
        width = min(w for w in r.widths if w >= min(need, r.widths[-1]))
        if width > kv_cache.slots_of(state.cache.rows):
            state = r.grow(state, width)
        want = r.block if queued < count else r.slots
        state, info = progs.segment(params, state, rep(np.int32(want)), total)
        fin, col, leg_wasted = (np.array(sharding.host_array(x)) for x in info)
        wasted += int(leg_wasted)
    out = progs.merge(out, state, rep(np.arange(r.slots, dtype=np.int32)))
    steps = int(state.step)
    return out, RefillStats(steps, steps * r.slots, wasted)


@functools.lru_cache(maxsize=16)
def _compiled(r: _Refill) -> Any:
    progs = _Programs(
        start=jax.jit(r.start, static_argnums=4),
        refill=jax.jit(r.merged_refill, donate_argnums=(0, 1), static_argnums=4),
        segment=jax.jit(r.segment, donate_argnums=1, static_argnums=3),
        merge=jax.jit(r.merge, donate_argnums=0))
    base = sampling._compiled(r.base)  # the one-pass sampler's `weights` / `shared`

    def run(params: Any, prompts: Any, prompt_lens: Any, rng: Array, *, cast: Any = None,
            rows: int | None = None) -> sampling.SampleOutput:
        mesh = r.base.mesh
        with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
            w = cast if cast is not None else base.shared(params)
            out, run.last_stats = _loop(r, progs, w, np.asarray(prompts, np.int32),
                                        np.asarray(prompt_lens, np.int32), rng, rows)
        return out

    run.weights, run.shared, run.last_stats = base.weights, base.shared, None
    run.slots, run.block = r.slots, r.block
    run.programs = progs  # the plan traces them (`plan.programs`)
    return run


def refill_fn(config: Any, options: Any, *, slots: int, block: int | None = None,
              **kwargs: Any) -> sampling.GenerateFn:
    """`sampling.generate_fn`'s sampler (same arguments in `kwargs`, compaction aside) that
    decodes `slots` rows at a time and refills `block` finished slots at once from the call's
    queue of B*R rows. `block` None: a sixteenth of the slots, a multiple of the mesh's batch
    devices (a smaller block wastes fewer slot-steps and costs more host round trips:
    `experiments/benchmarks/bench_refill.py`). After a call, `fn.last_stats` is its
    `RefillStats`. A call's `rows` (default all B*R) decodes only the queue's first `rows`
    rows, the others left empty: callers with a varying number of rows pad the prompts to
    one shape and compile once (partial rollouts' rounds)."""
    kwargs.pop("compact", None)
    base = sampling.generate_fn(config, options, compact=False, **kwargs)
    sampler = base.sampler
    devices = 1 if sampler.mesh is None else (sampler.mesh.shape["data"]
                                              * sampler.mesh.shape["fsdp"])
    if slots < 1 or slots % devices:
        raise ValueError(f"slots={slots}: must be a positive multiple of the mesh's "
                         f"{devices} batch devices")
    block = block or max(devices, slots // 16 // devices * devices)
    if not 1 <= block <= slots:
        raise ValueError(f"block={block}: must be in [1, slots={slots}]")
    return _compiled(_Refill(sampler, int(slots), int(block)))
