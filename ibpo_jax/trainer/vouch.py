"""The `vouched_steps` operator's host side (issue 57): the steps of each wrong response that
the policy's own continuations vouch for.

A step of a wrong response counts as right when something shows it right, and two signals that
never read the checker can: a correct peer of the group took the step
(`comparison.peer_first_errors`, in the task's canonical form), or one of `ibpo.completions`
continuations the policy samples from the prefix that ends with the step is judged right by
the reward. Where the reward passes only responses whose every step is right (`countdown`), a
right continuation proves its prefix right; where it reads the final answer alone (`arith`), a
right answer can follow a wrong step, and the continuations vouch less surely (`credit`
measures both). Neither signal shows a step wrong, and each misses right steps (a right path
no peer took; a right prefix whose sampled continuations all go wrong), so the first error is
the first step neither vouches for. Peers vouch for the steps before e_i
(`comparison.peer_first_errors`); from there the continuations test the prefix ending with
step e_i and, while one of them is right, the next (`vouched`), up to the step before the last
(whose prefix is the wrong response itself). Where the walk stops, v_i, is the first error:
`comparison.phi_vouched_steps` keeps max(peer e_i, v_i).

Each round is one batch of the rows still walking, so a row whose peers' first error is the
real one costs one prefix. Each continuation is a trajectory of the rollout budget.
Deterministic given the step's key and params, so a resumed run samples the same
continuations.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ibpo_jax.config.sections import IbpoConfig
from ibpo_jax.core import comparison
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import continuations, sampling
from ibpo_jax.trainer import credit as credit_lib

STREAM = 1 << 20  # fold_in(step key, STREAM): the continuations' own random stream

# score(records, tokens [m, L], lengths [m]) -> (reward, correct, ended) of rows every process
# holds (`batching.score_all_rows`).
Score = Callable[[Sequence[dict], np.ndarray, np.ndarray], tuple[np.ndarray, ...]]


class Vouch(NamedTuple):
    """What vouching needs of the run, built once (`trainer.parts`)."""

    generate: sampling.GenerateFn  # num_samples = ibpo.completions, on the training mesh
    ibpo: IbpoConfig
    group_size: int
    is_delim: np.ndarray  # [V] bool: the tokens that end a step
    width: int  # prefix prompt columns: rollout.max_prompt_len + rollout.max_new_tokens
    chunk: int  # prefixes per sampler call (the rollout's: sample_chunk, else B)
    pad_id: int


def build(ibpo: IbpoConfig, rollout: Any, generate: sampling.GenerateFn, tokenizer: Any
          ) -> Vouch:
    """The run's `Vouch`: `generate` samples ibpo.completions continuations a prompt on the
    training mesh; prefixes take the rollout's prompt + response width, as many a sampler call
    as the rollout's prompts (rollout.sample_chunk, else B: the knob that fits its memory)."""
    return Vouch(generate, ibpo, rollout.group_size, np.asarray(tokenizer.is_delim),
                 rollout.max_prompt_len + rollout.max_new_tokens,
                 rollout.sample_chunk or rollout.prompts_per_step, tokenizer.pad_id)


def step_end_columns(tokens: np.ndarray, length: int, is_delim: np.ndarray) -> np.ndarray:
    """[k] the column that closes each non-empty step of one response (tokens [R], the first
    `length` real, EOS not among them): the delimiter right after the step's last token, or
    that token when the response ends there. Steps as `units.split_steps` cuts them (ids
    outside the vocabulary are no delimiters)."""
    t = np.asarray(tokens[:length])
    inside = (t >= 0) & (t < len(is_delim))
    delim = np.zeros(len(t), bool)
    delim[inside] = np.asarray(is_delim)[t[inside]]
    last = ~delim & np.append(delim[1:], True)  # the last token of a run of non-delimiters
    cols = np.flatnonzero(last)
    return np.where(cols + 1 < len(t), cols + 1, cols)


@functools.partial(jax.jit, static_argnames=("ibpo", "g"))
def peer_first(rollout: credit_lib.Rollout, is_delim: jax.Array, *, ibpo: IbpoConfig, g: int
               ) -> tuple[jax.Array, jax.Array]:
    """(peer first errors [N], steps n [N]) on the units φ compares (`credit.compared_units`)."""
    u = comparison.response_units(rollout.response, rollout.response_len, rollout.ended,
                                  is_delim, granularity="step", max_units=ibpo.max_units or None)
    units, _ = credit_lib.compared_units(ibpo, rollout, u)
    e = jax.vmap(comparison.peer_first_errors)(credit_lib.groups(units, g),
                                               credit_lib.groups(u.n_units, g),
                                               credit_lib.groups(rollout.correct, g))
    return e.reshape(-1), u.n_units


def vouched(v: Vouch, *, params: Any, prompt: np.ndarray, prompt_len: np.ndarray,
            response: np.ndarray, response_len: np.ndarray, ended: np.ndarray,
            first: np.ndarray, n_steps: np.ndarray, scored: np.ndarray,
            judge: continuations.Judge, key: jax.Array) -> tuple[np.ndarray, dict[str, float]]:
    """(v [N] int32: for each scored row a continuation moved past `first`, the first step
    after it whose prefix no sampled continuation completes right; 0 for every other row, where
    the operator keeps the peers' first error; the step's metrics). Round r samples
    step first + r of the rows whose every earlier prefix from `first` on was vouched for, so
    a row whose peers' first error is the real one costs one prefix. Host arrays of every row:
    prompt [N, P] left-padded to prompt_len, response [N, R] to response_len (EOS included
    where `ended`); first / n_steps / scored [N] (`peer_first`, the rows φ scores).
    judge(rows [m], tokens, lengths) -> [m] bool."""
    length = response_len - ended.astype(response_len.dtype)
    out = np.where(scored, first, 0).astype(np.int32)
    rows = np.flatnonzero(scored & (first <= n_steps - 2))  # the last step: the row itself
    cols = {int(i): step_end_columns(response[i], int(length[i]), v.is_delim) for i in rows}
    sampled = dropped = rounds = 0
    while len(rows):
        known = np.array([out[i] < len(cols[int(i)]) for i in rows], bool)  # host = device steps
        pos = np.array([cols[int(i)][min(out[i], len(cols[int(i)]) - 1)] for i in rows],
                       np.int64)
        # A longer prefix than the sampler's prompt width stops its row there (counted).
        fits = known & (prompt_len[rows] + pos + 1 <= v.width)
        dropped += int((~fits).sum())
        rows, pos = rows[fits], pos[fits]
        if not len(rows):
            break
        prompts, lengths = continuations.prefix_prompts(prompt, prompt_len, response, rows, pos,
                                                        width=v.width, pad_id=v.pad_id)
        right = continuations.sample_fractions(
            generate=v.generate, params=params, prompts=prompts, lengths=lengths, rows=rows,
            pos=pos, response=response, judge=judge, num_completions=v.ibpo.completions,
            chunk=v.chunk, pad_id=v.pad_id, key=jax.random.fold_in(key, rounds)) > 0
        sampled, rounds = sampled + len(rows), rounds + 1
        moved = rows[right]
        out[moved] += 1
        rows = moved[out[moved] <= n_steps[moved] - 2]
    n = max(int(scored.sum()), 1)
    return np.where(scored & (out > first), out, 0).astype(np.int32), {
        "vouch_prefixes": float(sampled), "vouch_completions": float(sampled * v.ibpo.completions),
        "vouch_prefixes_dropped": float(dropped), "vouch_rounds": float(rounds),
        "vouch_moved_frac": float(np.sum(scored & (out > first)) / n)}


def label(v: Vouch, rollout: credit_lib.Rollout, *, records: Sequence[dict], params: Any,
          key: jax.Array, score: Score, mesh: Any) -> tuple[credit_lib.Rollout, int,
                                                               dict[str, float]]:
    """`rollout` with `step_vouched` set on every row, the continuations sampled (trajectories
    for the budget) and the metrics. Every process holds and samples all rows alike (the
    sampler is one program over the mesh); each scores a share (`score`)."""
    g = v.group_size
    with jax.set_mesh(mesh):
        first, n_steps = peer_first(rollout, jnp.asarray(v.is_delim), ibpo=v.ibpo, g=g)
    host = {f: sharding.host_array(getattr(rollout, f)) for f in (
        "prompt", "prompt_len", "response", "response_len", "ended", "correct")}
    correct = host["correct"].reshape(-1, g)
    first, n_steps = sharding.host_array(first), sharding.host_array(n_steps)
    scored = np.array(credit_lib.phi_scored(correct)).reshape(-1) & (n_steps > 0)
    if rollout.valid is not None:  # dynamic sampling's fillers: not learned, not scored
        scored &= sharding.host_array(rollout.valid)

    def judge(rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        return score([records[int(r) // g] for r in rows], tokens, lengths)[1]

    with jax.set_mesh(mesh):
        out, metrics = vouched(v, params=params, prompt=host["prompt"],
                               prompt_len=host["prompt_len"], response=host["response"],
                               response_len=host["response_len"], ended=host["ended"],
                               first=first, n_steps=n_steps, scored=scored, judge=judge,
                               key=jax.random.fold_in(key, STREAM))
    placed = sharding.global_array(out, sharding.batch_sharding(mesh, 1))
    return (rollout._replace(step_vouched=placed), int(metrics["vouch_completions"]),
            metrics)
