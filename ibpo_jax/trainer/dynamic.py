"""The rollout knobs of DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning
System at Scale", arXiv:2503.14476) around the RL step's sampling (issue 45, DESIGN §6):

* dynamic sampling (DAPO §3.2, eq. 11's constraint 0 < |{correct}| < G): a group whose raw
  outcome R is all-equal has no group-relative signal, so it is dropped and more prompts are
  sampled, `rollout.max_sampling_rounds` rounds at most, until B mixed groups are found. The
  filter reads the verifier's R, never R + λφ nor any shaped reward: a shaped reward varies
  inside an all-wrong group and would keep groups whose only "signal" is shaping noise.
  Short of B, filtered groups fill the batch as invalid rows (`Sampled.valid`): no loss, and
  no part in the step's batch metrics (reward_mean, accuracy, frac_groups_all_same, φ,
  entropy...: trained rows only), while `groups_*`, `sampling_rounds`,
  `trajectories_sampled` and the budget count every sampled trajectory.
* overlong handling (DAPO §3.4): "filter" (overlong filtering) takes the truncated responses
  out of the loss; "soft" (soft overlong punishment, eq. 13) adds a length penalty to R.

`sample_scored` is one round (sample -> score), `collect_rounds` the step's rounds; both are
functions of the step key, the params and the data position only (an off-policy collector may
run them in a thread of its own), reading the run through a `RoundSource`
(`collect.Collector`).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Protocol

import jax
import numpy as np
from jax.sharding import Mesh

from ibpo_jax.config import RunConfig
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import sampling
from ibpo_jax.trainer.batching import PromptBatch
from ibpo_jax.trainer.credit import Rollout

# fold_in tag of the extra rounds' keys: apart from the sampler chunks' fold_in(key, i) and the
# methods' extra round's fold_in(key, 1). Round 0 samples with the step key itself, as without
# dynamic sampling.
ROUND_SALT = 0x445350


class Sampled(NamedTuple):
    """A step's sampled and scored rows: the prompt records and their encoding, the samples on
    the mesh, the rows this process scored with their raw R, correctness, ended-with-EOS and
    verifier reports, every row's response length, the phases' wall times, the trajectories
    sampled for it and (dynamic sampling) which rows belong to a trained group."""

    records: list[dict]  # [B]
    prompts: PromptBatch
    out: sampling.SampleOutput  # [N, ...] on the mesh
    rows: np.ndarray  # [n] rows this process scored
    reward: np.ndarray  # [n] the verifier's R
    correct: np.ndarray  # [n] bool
    ended: np.ndarray  # [n] bool
    infos: list[dict]  # [n]
    lengths: np.ndarray  # [N]
    times: dict[str, float]  # time_rollout_s, time_reward_s
    sampled: int  # trajectories sampled, every round's
    valid: np.ndarray | None = None  # [N] bool: False on the filler groups' rows


class RoundSource(Protocol):
    """What a round reads of the run: its config and mesh, the next prompts with their samples
    (`sample`), the verifier (`score`)."""

    cfg: RunConfig
    mesh: Mesh

    def sample(self, key: jax.Array, params: Any
               ) -> tuple[list[dict], PromptBatch, sampling.SampleOutput]: ...

    def score(self, records: list[dict], tokens: np.ndarray, lengths: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]: ...


def sample_scored(source: RoundSource, key: jax.Array, params: Any) -> Sampled:
    """One round: the data sampler's next B prompts, G samples of each with `params` and
    `key`, each process scoring the rows its devices hold."""
    g = source.cfg.rollout.group_size
    t0 = time.perf_counter()
    records, prompts, out = source.sample(key, params)
    # Every row's length is needed by all processes (the packing plan).
    rows, tokens = sharding.local_rows(out.tokens)
    lengths = sharding.host_array(out.lengths)
    t1 = time.perf_counter()
    reward, correct, ended, infos = source.score([records[i // g] for i in rows], tokens,
                                                  lengths[rows])
    times = {"time_rollout_s": t1 - t0, "time_reward_s": time.perf_counter() - t1}
    return Sampled(records, prompts, out, rows, reward, correct, ended, infos, lengths, times,
                 len(lengths))


def round_key(key: jax.Array, r: int) -> jax.Array:
    """Round r's sampling key: the step key itself for round 0 (bitwise as without dynamic
    sampling), then a pure function of (step key, r), so a resumed run samples the same."""
    return key if r == 0 else jax.random.fold_in(jax.random.fold_in(key, ROUND_SALT), r)


def mixed_groups(*, reward: np.ndarray, g: int) -> np.ndarray:
    """reward [B·G] raw R, prompt-major -> [B] bool: the groups whose R is not all-equal."""
    y = np.asarray(reward).reshape(-1, g)
    return np.any(y != y[:, :1], axis=1)


def choose_groups(*, mixed: list[np.ndarray], b: int) -> tuple[np.ndarray, int]:
    """The step's B groups from the rounds' groups (mixed[r]: [B] bool of round r): the first
    B mixed ones in (round, group) order (a last round's surplus is dropped, as DAPO does),
    then, short of B, the first filtered ones as fillers. Returns ([B, 2] (round, group)
    pairs, mixed first, and how many are mixed)."""
    pairs = [(r, j) for r, m in enumerate(mixed) for j in range(len(m))]
    flags = np.concatenate(mixed)
    order = [pairs[i] for i in np.flatnonzero(flags)] + [pairs[i] for i in np.flatnonzero(~flags)]
    return np.array(order[:b], np.int64).reshape(b, 2), int(min(flags.sum(), b))


def _everywhere(x: np.ndarray, rows: np.ndarray, n: int, mesh: Any) -> np.ndarray:
    """The [N] whole of per-row values that each process knows for its `rows` only."""
    x = np.asarray(x)
    wire = np.uint8 if x.dtype == bool else x.dtype
    placed = sharding.rows_array(x.astype(wire), rows, n, sharding.batch_sharding(mesh, 1))
    return sharding.host_array(placed).astype(x.dtype)


def collect_rounds(source: RoundSource, key: jax.Array, params: Any
                   ) -> tuple[Sampled, dict[str, float]]:
    """The step's batch: one round, or with `rollout.dynamic_sampling` as many as it takes to
    find B groups whose raw R is mixed (`max_sampling_rounds` at most), and its metrics."""
    cfg = source.cfg.rollout
    first = sample_scored(source, key, params)
    if not cfg.dynamic_sampling:
        return first, {}
    b, g, n = cfg.prompts_per_step, cfg.group_size, len(first.lengths)
    rounds = [first]
    mixed = [mixed_groups(reward=_everywhere(first.reward, first.rows, n, source.mesh), g=g)]
    while sum(int(m.sum()) for m in mixed) < b and len(rounds) < cfg.max_sampling_rounds:
        with jax.set_mesh(source.mesh):  # keys placed like the step key: one sampler compile
            k = round_key(key, len(rounds))
        rounds.append(sample_scored(source, k, params))
        got = rounds[-1]
        mixed.append(mixed_groups(reward=_everywhere(got.reward, got.rows, n, source.mesh),
                                  g=g))
    picks, n_mixed = choose_groups(mixed=mixed, b=b)
    found = sum(int(m.sum()) for m in mixed)
    stats = {"sampling_rounds": float(len(rounds)), "trajectories_sampled": float(len(rounds) * n),
             "groups_filtered": float(len(rounds) * b - found), "groups_mixed": float(n_mixed),
             "tokens_sampled": float(sum(int(r.lengths.sum()) for r in rounds))}
    return assemble(source, rounds, picks, n_mixed), stats


def assemble(source: RoundSource, rounds: list[Sampled], picks: np.ndarray, n_mixed: int
             ) -> Sampled:
    """The rows of the picked groups (`choose_groups`) as one batch of B groups, the same
    shapes every step (one compile): the first n_mixed groups valid, the fillers not."""
    g, mesh = source.cfg.rollout.group_size, source.mesh
    n = len(rounds[0].lengths)
    src = np.repeat(picks[:, 0], g)  # each new row's round and row there
    row = (picks[:, 1:] * g + np.arange(g)).reshape(-1)
    take = lambda xs: np.stack(xs)[src, row]
    out = sampling.SampleOutput(*(None if getattr(rounds[0].out, f) is None else (
        sharding.global_array(take([sharding.host_array(getattr(r.out, f)) for r in rounds]),
                              sharding.batch_sharding(mesh, getattr(rounds[0].out, f).ndim)))
        for f in sampling.SampleOutput._fields))  # [N, ...] each; fields a sampler left None
    whole = {f: take([_everywhere(getattr(r, f), r.rows, n, mesh) for r in rounds])
             for f in ("reward", "correct", "ended")}
    records = [rounds[r].records[j] for r, j in picks]
    prompts = PromptBatch(np.stack([rounds[r].prompts.tokens[j] for r, j in picks]),
                          np.array([rounds[r].prompts.lengths[j] for r, j in picks], np.int32),
                          sum(r.prompts.truncated for r in rounds))
    rows, tokens = sharding.local_rows(out.tokens)
    lengths = sharding.host_array(out.lengths)
    infos = _reports(source, rounds, src[rows], row[rows], records, rows, tokens, lengths)
    times = {k: sum(r.times[k] for r in rounds) for k in rounds[0].times}
    return Sampled(records, prompts, out, rows, *(whole[f][rows] for f in whole), infos, lengths,
                 times, sum(r.sampled for r in rounds), np.arange(n) < n_mixed * g)


def _reports(source: RoundSource, rounds: list[Sampled], src: np.ndarray, row: np.ndarray,
             records: list[dict], rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray
             ) -> list[dict]:
    """The verifier's reports of this process's rows of the assembled batch (rows [n], from
    round src[i]'s row row[i]): the ones it scored in their round, the rest (on several
    processes, rows it did not hold there) scored again now (the same record and text)."""
    g = source.cfg.rollout.group_size
    known = [dict(zip(r.rows.tolist(), r.infos)) for r in rounds]
    infos = [known[s].get(int(j)) for s, j in zip(src, row)]
    missing = [i for i, info in enumerate(infos) if info is None]
    if missing:
        m = np.array(missing)
        again = source.score([records[rows[i] // g] for i in missing], tokens[m],
                              lengths[rows[m]])[3]
        for i, info in zip(missing, again):
            infos[i] = info
    return infos


def overlong_penalty(*, lengths: np.ndarray, max_new_tokens: int, buffer: int,
                     penalty: float) -> np.ndarray:
    """DAPO's soft overlong punishment (eq. 13) scaled by `penalty`: lengths [N] -> [N]
    float32, 0 up to L_max - L_cache tokens, then linear down to -penalty at L_max
    (L_max = max_new_tokens, the sampler's cap; L_cache = buffer)."""
    start = max_new_tokens - buffer
    ramp = np.clip((np.asarray(lengths, np.float64) - start) / buffer, 0.0, 1.0)
    return (-penalty * ramp).astype(np.float32)


def shaped_reward(cfg: RunConfig, got: Sampled, stats: dict[str, float]) -> np.ndarray:
    """This process's rows' R [n] as the update sees it: with reward.overlong "soft", plus the
    length penalty (`overlong_penalty`; its mean over the trained rows -> stats). The raw R
    and the correctness (dynamic sampling's filter, φ) are left as they are."""
    if cfg.reward.overlong != "soft":
        return got.reward
    pen = overlong_penalty(lengths=got.lengths, max_new_tokens=cfg.rollout.max_new_tokens,
                           buffer=cfg.reward.overlong_buffer,
                           penalty=cfg.reward.overlong_penalty)
    live = np.ones(len(pen), bool) if got.valid is None else got.valid
    stats["overlong_penalty_mean"] = float(pen[live].mean()) if live.any() else 0.0
    return (np.asarray(got.reward, np.float32) + pen[got.rows]).astype(np.float32)


def update_rows(cfg: RunConfig, rollout: Rollout) -> Rollout:
    """The update's rollout: with reward.overlong "filter" (DAPO's overlong filtering) the
    truncated responses carry no loss tokens, hence no gradient. Their advantages were
    computed before, with them in their group's mean and std, as DAPO's filter does."""
    if cfg.reward.overlong != "filter":
        return rollout
    keep = rollout.ended if rollout.valid is None else rollout.valid & rollout.ended
    return rollout._replace(valid=keep)
