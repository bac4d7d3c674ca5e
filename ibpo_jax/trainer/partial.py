"""Partial rollouts (issue 59, `rollout.partial`): the longest responses carry over to the next
step instead of stalling this one (as verl, slime and AReaL do).

`InFlight` holds `prompts_in_flight` (K) prompts' G rows each. A step first tops the flight up
with the training split's next prompts, then decodes in rounds: every unfinished row decodes
`round_tokens` (T) more tokens under the step's weights (fewer where it ends), until at least B
whole groups have finished; the step learns the B oldest finished groups, and every other row
stays in flight, carried into the next step. There a carried row continues from its prefix,
re-encoded under the new weights with its prompt (no key/value cache is kept across an
update), so its tokens are sampled by the policies of several steps: each token keeps the
log-prob of the policy that sampled it, which the update takes as π_old of its ratio
(trainer/step.py, as one step off-policy), and the step that sampled it, from which
`policy_lag` (mean over the batch's tokens) and `policy_lag_max` are counted.

Why rounds of T tokens, each re-encoding the prefixes, and not one decode loop stopped
mid-flight: a round is calls of the run's sampler (sampling.generate_fn in calls of C =
sample_chunk x G rows, or with rollout.refill a refill call on C slots) over the unfinished rows
as prompts of their own (a fresh prompt's first round: its G rows from one encoding), so without
refill only one call's key/value cache is ever held, as without partial rollouts (the cache of
all K x G rows at once is what sample_chunk exists to avoid; with refill, its prompt store holds
every unfinished row's prompt + prefix, which the plan counts), and every round has fixed shapes
([C, P + M] prompts, M a multiple of T below N; T new tokens) and reuses its compiled programs.
A row's length stays a multiple of T until it ends, and T divides max_new_tokens, so no row is
cut inside a round. The cost: each round re-encodes the prefixes (the plan prices it at the
prefill's rate, `plan.lengths.partial`), and a round runs on up to T - 1 decode steps past the
point where B groups were finished.

Resume. The flight (its records' indices, prompts, tokens, log-probs, steps and lengths) is
part of every checkpoint (`saved` / `restored`, the checkpoint's .npz); the data position is
after the flight's prompts, and the rounds' keys are functions of the step key, so a resumed
run samples what the uninterrupted one did. Axis letters: K prompts in flight, G rows each, N
max_new_tokens, P max_prompt_len, T round_tokens, C rows per sampler call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import sampling
from ibpo_jax.trainer import batching, checkpoint, offpolicy
from ibpo_jax.trainer.batching import PromptBatch

ROUND_SALT = 0x5A17  # the rounds' keys: fold_in(fold_in(step key, ROUND_SALT), round)
GROUP_FIELDS = ("index", "prompt", "prompt_len", "cut")  # one entry per prompt, then per row
FIELDS = (*GROUP_FIELDS, "tokens", "logprobs", "born", "lengths", "done", "entropy")


@dataclasses.dataclass
class Flight:
    """The prompts in flight, oldest first, and their rows so far (host arrays)."""

    index: np.ndarray  # [K] int64: each prompt's record in the training split
    prompt: np.ndarray  # [K, P] int32, left-padded
    prompt_len: np.ndarray  # [K] int32
    cut: np.ndarray  # [K] bool: the prompt was longer than P (left-truncated)
    tokens: np.ndarray  # [K*G, N] int32, pad after each row's length
    logprobs: np.ndarray  # [K*G, N] float32: the sampling policy's, 0 past the length
    born: np.ndarray  # [K*G, N] int32: the step that sampled each token
    lengths: np.ndarray  # [K*G] int32
    done: np.ndarray  # [K*G] bool: ended (EOS) or at max_new_tokens
    entropy: np.ndarray  # [K*G] float32: Σ over the row's tokens

    @classmethod
    def empty(cls, p: int, n: int) -> Flight:
        z = lambda *shape, dtype=np.int32: np.zeros(shape, dtype)  # noqa: E731
        return cls(z(0, dtype=np.int64), z(0, p), z(0), z(0, dtype=bool), z(0, n),
                   z(0, n, dtype=np.float32), z(0, n), z(0), z(0, dtype=bool),
                   z(0, dtype=np.float32))

    def groups(self, keep: np.ndarray, g: int) -> Flight:
        """The flight's prompts `keep` [k] (and their rows), in that order."""
        rows = (keep[:, None] * g + np.arange(g)).reshape(-1)
        return Flight(*(getattr(self, f)[keep if f in GROUP_FIELDS else rows] for f in FIELDS))

    def joined(self, other: Flight) -> Flight:
        return Flight(*(np.concatenate([getattr(self, f), getattr(other, f)])
                        for f in FIELDS))


class InFlight:
    """The prompts in flight (module docstring) and the rounds that decode them. `first`
    decodes a fresh prompt's first T tokens (num_samples G: the prompt encoded once, as
    without partial rollouts), `sampler` a carried row's next T (num_samples 1: the row's
    prompt + prefix its prompt), both on `mesh`; `is_eos` says which tokens end a row;
    `rows_per_call` is C (one-pass samplers) or the refill samplers' slots."""

    def __init__(self, cfg: Any, *, mesh: Any, first: sampling.GenerateFn,
                 sampler: sampling.GenerateFn, is_eos: Callable[[np.ndarray], np.ndarray],
                 pad_id: int):
        r = cfg.rollout
        self.b, self.g, self.k = r.prompts_per_step, r.group_size, r.prompts_in_flight
        self.n, self.p, self.t = r.max_new_tokens, r.max_prompt_len, r.round_tokens
        self.refill = r.refill
        self.rows_per_call = (r.sample_chunk or r.prompts_per_step) * r.group_size
        self.mesh, self.sampler, self.is_eos, self.pad_id = mesh, sampler, is_eos, pad_id
        self.first = first
        self.flight = Flight.empty(self.p, self.n)
        self.step = 0  # steps taken: the `born` of the next step's tokens
        self.metrics: dict[str, float] = {}  # the last step's

    def sample(self, collector: Any, key: jax.Array, params: Any
               ) -> tuple[list[dict], PromptBatch, sampling.SampleOutput]:
        """The step's B finished groups (`collect.Collector.sample`'s contract): their
        records, prompts and rows, on the training mesh `collector.mesh`."""
        self._top_up(collector)
        f, g = self.flight, self.g
        counts = {"decode_steps": 0, "slot_steps": 0, "tokens": 0}
        rounds = 0
        with jax.set_mesh(self.mesh):
            cast = self.sampler.shared(params)  # one compute-dtype copy for every round
            while f.done.reshape(-1, g).all(axis=1).sum() < self.b:
                round_key = jax.random.fold_in(jax.random.fold_in(key, ROUND_SALT), rounds)
                self._round(params, cast, round_key, counts)
                rounds += 1
        finished = np.flatnonzero(f.done.reshape(-1, g).all(axis=1))
        take = finished[:self.b]
        batch = f.groups(take, g)
        self.flight = f.groups(np.setdiff1d(np.arange(len(f.index)), take), g)
        self._metrics(batch, rounds, counts)
        self.step += 1
        place = lambda x: sharding.global_array(  # noqa: E731
            x, sharding.batch_sharding(collector.mesh, np.ndim(x)))
        out = sampling.SampleOutput(place(batch.tokens), place(batch.lengths),
                                    place(batch.logprobs), place(batch.entropy))
        records = [collector.records[int(i)] for i in batch.index]
        prompts = PromptBatch(batch.prompt, batch.prompt_len, int(batch.cut.sum()))
        return records, prompts, out

    def _top_up(self, collector: Any) -> None:
        """The training split's next prompts, up to K in flight, with empty rows."""
        new = self.k - len(self.flight.index)
        index = np.asarray(collector.order.next_indices(new), np.int64)
        texts = [collector.task.prompt_text(collector.records[int(i)]) for i in index]
        # One at a time: which prompts were cut (a batch's encoding counts them).
        enc = [batching.encode_prompts(collector.tokenizer, [t], self.p) for t in texts]
        rows = new * self.g
        fresh = Flight(index, np.concatenate([e.tokens for e in enc]).reshape(new, self.p),
                       np.array([e.lengths[0] for e in enc], np.int32),
                       np.array([e.truncated > 0 for e in enc], bool),
                       np.full((rows, self.n), self.pad_id, np.int32),
                       np.zeros((rows, self.n), np.float32), np.zeros((rows, self.n), np.int32),
                       np.zeros(rows, np.int32), np.zeros(rows, bool),
                       np.zeros(rows, np.float32))
        self.flight = self.flight.joined(fresh)

    def _round(self, params: Any, cast: Any, key: jax.Array, counts: dict[str, int]) -> None:
        """Every unfinished row decodes T more tokens (fewer where it ends): the fresh
        prompts' G rows by `first` (`_fresh`), the carried rows by `sampler` (`_carried`)."""
        f, g = self.flight, self.g
        fresh = np.flatnonzero((f.lengths.reshape(-1, g) == 0).all(axis=1))
        carried = np.flatnonzero(~f.done & (f.lengths > 0))
        if len(fresh):
            self._fresh(params, cast, jax.random.fold_in(key, 0), fresh, counts)
        if len(carried):
            self._carried(params, cast, jax.random.fold_in(key, 1), carried, counts)

    def _fresh(self, params: Any, cast: Any, key: jax.Array, fresh: np.ndarray,
               counts: dict[str, int]) -> None:
        """The first T tokens of the G rows of each of the flight's prompts `fresh`: in calls
        of C / G prompts (with refill, one call over them, padded to K prompts)."""
        f, g, c = self.flight, self.g, self.rows_per_call
        calls = [fresh] if self.refill else [fresh[i:i + c // g]
                                             for i in range(0, len(fresh), c // g)]
        for i, part in enumerate(calls):
            size = self.k if self.refill else c // g
            take = np.concatenate([part, np.repeat(part[:1], size - len(part))])
            rows = (part[:, None] * g + np.arange(g)).reshape(-1)
            self._call(self.first, params, f.prompt[take], f.prompt_len[take],
                       key if self.refill else jax.random.fold_in(key, i), cast, rows, counts)

    def _carried(self, params: Any, cast: Any, key: jax.Array, live: np.ndarray,
                 counts: dict[str, int]) -> None:
        """The next T tokens of the carried rows `live`, each its prompt + prefix as a prompt
        of its own: in calls of C rows, the longest prefixes first, so that rows of like
        prefix share a call and its prompt width (one of N / T, each compiled once); with
        refill, one call over them, padded to K x G rows."""
        c = self.rows_per_call
        if self.refill:
            calls = [live]
        else:
            live = live[np.argsort(-self.flight.lengths[live], kind="stable")]
            calls = [live[i:i + c] for i in range(0, len(live), c)]
        for i, rows in enumerate(calls):
            prompts, lens = self._continuations(rows)
            pad = (len(self.flight.done) if self.refill else c) - len(rows)
            prompts = np.concatenate([prompts, np.repeat(prompts[:1], pad, axis=0)])
            lens = np.concatenate([lens, np.repeat(lens[:1], pad)])
            self._call(self.sampler, params, prompts, lens,
                       key if self.refill else jax.random.fold_in(key, i), cast, rows, counts)

    def _call(self, fn: sampling.GenerateFn, params: Any, prompts: np.ndarray,
              lens: np.ndarray, key: jax.Array, cast: Any, rows: np.ndarray,
              counts: dict[str, int]) -> None:
        """One sampler call whose first len(rows) output rows are the flight's `rows` (the
        others fill its fixed shape: copies, or with refill never decoded), appended."""
        if self.refill:
            out = fn(params, prompts, lens, key, cast=cast, rows=len(rows))
            counts["decode_steps"] += fn.last_stats.decode_steps
            counts["slot_steps"] += fn.last_stats.slot_steps
        else:
            out = fn(params, prompts, lens, key, cast=cast)
        got = [sharding.host_array(x) for x in out]
        if not self.refill:  # the call decodes until its longest row ends
            counts["decode_steps"] += int(got[1].max()) - 1
            counts["slot_steps"] += (int(got[1].max()) - 1) * self.rows_per_call
        self._append(rows, *(x[:len(rows)] for x in got))
        counts["tokens"] += int(got[1][:len(rows)].sum()) - len(rows)

    def _append(self, rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray,
                logprobs: np.ndarray, entropy: np.ndarray) -> None:
        """A round's samples [R, T] of the flight's rows `rows` [R], after their tokens."""
        f = self.flight
        for j, r in enumerate(rows):
            at, m = f.lengths[r], lengths[j]
            f.tokens[r, at:at + m] = tokens[j, :m]
            f.logprobs[r, at:at + m] = logprobs[j, :m]
            f.born[r, at:at + m] = self.step
        f.lengths[rows] += lengths
        f.entropy[rows] += entropy
        ended = self.is_eos(tokens[np.arange(len(rows)), np.maximum(lengths - 1, 0)])
        # A row not ended decoded all T tokens (T divides N): its length stays a multiple of T.
        f.done[rows] = ended | (f.lengths[rows] >= self.n)

    def _continuations(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[R, P + M] prompts (left-padded: each row's prompt then its tokens so far, M the
        longest of those, at most N - T) and their lengths [R], for the flight's rows `rows`."""
        f, g = self.flight, self.g
        width = self.p + int(f.lengths[rows].max(initial=0))
        out = np.full((len(rows), width), self.pad_id, np.int32)
        lens = np.zeros(len(rows), np.int32)
        for j, r in enumerate(rows):
            k, m = r // g, f.lengths[r]
            ids = np.concatenate([f.prompt[k, self.p - f.prompt_len[k]:], f.tokens[r, :m]])
            out[j, width - len(ids):] = ids
            lens[j] = len(ids)
        return out, lens

    def _metrics(self, batch: Flight, rounds: int, counts: dict[str, int]) -> None:
        """The step's partial-rollout metrics (module docstring)."""
        mask = np.arange(self.n)[None, :] < batch.lengths[:, None]
        lag = np.where(mask, self.step - batch.born, 0)
        self.metrics = {
            "policy_lag": float(lag.sum() / max(mask.sum(), 1)),
            "policy_lag_max": float(lag.max(initial=0)),
            "partial_rounds": float(rounds),
            # rows left mid-response (a prompt topped up at a step without rounds: not yet)
            "partial_rows_carried": float((~self.flight.done & (self.flight.lengths > 0)).sum()),
            "partial_rows_waiting": float(self.flight.done.sum()),
            "decode_steps": float(counts["decode_steps"]),
            "slot_steps": float(counts["slot_steps"]),
            "wasted_slot_steps": float(counts["slot_steps"] - counts["tokens"]),
        }

    def saved(self) -> dict[str, np.ndarray]:
        """The flight as the checkpoint's arrays."""
        arrays = {f"partial_{name}": getattr(self.flight, name) for name in FIELDS}
        return {**arrays, "partial_step": np.asarray(self.step, np.int64)}

    def restored(self, arrays: dict[str, np.ndarray]) -> None:
        self.flight = Flight(*(np.array(arrays[f"partial_{name}"]) for name in FIELDS))
        self.step = int(arrays["partial_step"])


class Partial(offpolicy.OnPolicy):
    """The on-policy schedule whose collector samples from the flight (`InFlight`): its
    metrics are the flight's, and every checkpoint holds the flight."""

    def __init__(self, placement: offpolicy.Placement, flight: InFlight):
        super().__init__(placement)
        self.flight = flight

    def take(self, collector: Any, key: jax.Array, next_key: jax.Array | None,
             params: Any) -> tuple[Any, dict[str, float]]:
        got, _ = super().take(collector, key, next_key, params)
        return got, dict(self.flight.metrics)

    def saved(self, meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return meta, self.flight.saved()

    def restored(self, meta: dict[str, Any], arrays: Callable[[], dict[str, np.ndarray]]
                 ) -> None:
        """A checkpoint of a partial run holds the flight (one of another schedule, resumed
        under train.allow_config_change, holds none: the flight starts empty)."""
        if meta.get(checkpoint.ARRAYS):
            data = arrays()
            if "partial_index" in data:
                self.flight.restored(data)
