"""Monte-Carlo step labels for the PRM of the PRM+GSPO baseline (DESIGN §7), host side.

From each step prefix of a response (prompt + response up to a step end, `model.step_ends`),
`num_completions` continuations are sampled with the policy; the prefix's label is the fraction
of them whose full response (prefix then continuation) the judge accepts. The last step end
(the whole response) needs no sampling: its label is the judge's verdict on the response itself.
Every sampled continuation is a trajectory of the rollout budget: `cost` counts them.

Prefixes become prompts right-aligned in `max_prompt_len` columns; a prefix longer than that
is left out (valid=False, counted in `dropped`). They are sampled `chunk` at a time, the last
chunk padded with copies of its first prefix, so the sampler compiles once for every call with
the same shapes. Deterministic given `key` (chunk c samples with fold_in(key, c)).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from ibpo_jax.methods.prm import model as prm
from ibpo_jax.runtime import sharding

# judge(rows [m] index of the originating response, tokens [m, L] int32 (pad after each
# length), lengths [m]) -> [m] bool: is this full response correct.
Judge = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
_step_ends = jax.jit(prm.step_ends, static_argnames="max_steps")


class MCLabels(NamedTuple):
    pos: np.ndarray  # [n, K] int32 response column of each step end (`model.step_ends`)
    valid: np.ndarray  # [n, K] bool, a labelled step (not a dropped prefix, not an empty slot)
    labels: np.ndarray  # [n, K] float32 in [0, 1], 0 where not valid
    cost: int  # sampled completions (trajectories), to charge to the rollout budget
    dropped: int  # step prefixes left out because prompt + prefix > max_prompt_len


def prefix_prompts(prompt: np.ndarray, prompt_len: np.ndarray, response: np.ndarray,
                   rows: np.ndarray, pos: np.ndarray, *, width: int, pad_id: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Prompt + response[:pos + 1] of response rows[m], right-aligned in `width` columns.

    prompt [n, P] left-padded to prompt_len [n], response [n, R], rows / pos [M].
    Returns (tokens [M, width] int32, lengths [M] int32); lengths must be <= width.
    """
    p = prompt.shape[1]
    full = np.concatenate([prompt, response], axis=1)[rows]  # [M, P + R]
    start = p - prompt_len[rows]  # first real column of each row in `full`
    lengths = (prompt_len[rows] + pos + 1).astype(np.int32)
    col = np.arange(width)[None, :]
    src = start[:, None] + col - (width - lengths)[:, None]  # column of `full` shown at col
    got = np.take_along_axis(full, np.clip(src, 0, full.shape[1] - 1), axis=1)
    return np.where(src >= start[:, None], got, pad_id).astype(np.int32), lengths


def continued(response: np.ndarray, pos: np.ndarray, completion: np.ndarray,
              completion_len: np.ndarray, *, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """response[m, :pos[m] + 1] followed by completion[m, :completion_len[m]].

    response [m, R], pos [m], completion [m, L], completion_len [m].
    Returns (tokens [m, R + L] int32, pad_id after each length; lengths [m] int32).
    """
    (m, r), width = response.shape, response.shape[1] + completion.shape[1]
    col = np.arange(width)[None, :]
    head = col <= pos[:, None]
    tail_col = col - (pos[:, None] + 1)  # column of `completion` shown at col
    tail = ~head & (tail_col < completion_len[:, None])
    from_resp = np.take_along_axis(response, np.minimum(col, r - 1).repeat(m, 0), axis=1)
    from_comp = np.take_along_axis(completion, np.clip(tail_col, 0, completion.shape[1] - 1),
                                   axis=1)
    tokens = np.where(head, from_resp, np.where(tail, from_comp, pad_id))
    return tokens.astype(np.int32), (pos + 1 + completion_len).astype(np.int32)


def _judge(judge: Judge, rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray
           ) -> np.ndarray:
    ok = np.asarray(judge(rows, tokens, lengths), dtype=bool)
    if ok.shape != rows.shape:
        raise ValueError(f"judge returned shape {ok.shape}, expected {rows.shape}")
    return ok


def _sample_fractions(*, generate: Callable, params: Any, prompts: np.ndarray,
                      lengths: np.ndarray, rows: np.ndarray, pos: np.ndarray,
                      response: np.ndarray, judge: Judge, num_completions: int, chunk: int,
                      pad_id: int, key: jax.Array) -> np.ndarray:
    """The fraction [M] of `num_completions` sampled continuations of each prefix prompt
    (prompts [M, W], lengths [M]; prefix of response rows[m] up to pos[m]) that are correct."""
    out = np.zeros(len(prompts), np.float32)
    for c, start in enumerate(range(0, len(prompts), chunk)):
        sl = slice(start, start + chunk)
        real = len(prompts[sl])
        fill = chunk - real  # padding prefixes: copies of the chunk's first, results unused
        batch = np.concatenate([prompts[sl], np.repeat(prompts[sl][:1], fill, 0)])
        blens = np.concatenate([lengths[sl], np.repeat(lengths[sl][:1], fill)])
        sample = generate(params, batch, blens, jax.random.fold_in(key, c))
        tokens, tok_len = sharding.host_array(sample.tokens), sharding.host_array(sample.lengths)
        if tokens.shape[0] != chunk * num_completions:
            raise ValueError(f"generate returned {tokens.shape[0]} rows for {chunk} prompts: "
                             f"its num_samples must be num_completions={num_completions}")
        # Sampler rows are prompt-major: row j*N + s is sample s of prefix j.
        src, src_pos = np.repeat(rows[sl], num_completions), np.repeat(pos[sl], num_completions)
        n = real * num_completions
        full, full_len = continued(response[src], src_pos, tokens[:n], tok_len[:n],
                                   pad_id=pad_id)
        ok = _judge(judge, src, full, full_len)
        out[sl] = ok.reshape(real, num_completions).mean(axis=1)
    return out


def monte_carlo_labels(*, generate: Callable, params: Any, prompt: np.ndarray,
                       prompt_len: np.ndarray, response: np.ndarray, response_len: np.ndarray,
                       is_delim: np.ndarray, judge: Judge, num_completions: int,
                       max_steps: int, max_prompt_len: int, pad_id: int, key: jax.Array,
                       chunk: int = 32) -> MCLabels:
    """Monte-Carlo labels of the first `max_steps` step prefixes of n responses (DESIGN §7).

    generate: (params, prompts [B, max_prompt_len], prompt_lens [B], rng) -> SampleOutput
    with num_samples = num_completions (`sampling.generate_fn`; its max_new_tokens bounds the
    continuations). prompt [n, P] left-padded to prompt_len [n]; response [n, R] right-padded to
    response_len [n] (EOS included); is_delim [V] bool; judge: see `Judge`, called on full
    responses (prefix then continuation, or the response itself for its last step).
    """
    if num_completions < 1 or chunk < 1:
        raise ValueError(f"num_completions ({num_completions}) and chunk ({chunk}) must be >= 1")
    prompt, response = np.asarray(prompt), np.asarray(response)
    prompt_len = np.asarray(prompt_len)
    response_len = np.minimum(np.asarray(response_len), response.shape[1])
    # The judge sees pad_id after every length, whatever the caller left there.
    response = np.where(np.arange(response.shape[1]) < response_len[:, None], response, pad_id)
    pos, valid = (np.array(x) for x in _step_ends(response, response_len, np.asarray(is_delim),
                                                  max_steps=max_steps))
    labels = np.zeros(pos.shape, np.float32)
    final = valid & (pos == response_len[:, None] - 1)
    rows, ks = np.nonzero(final)  # at most one final step per row
    labels[rows, ks] = _judge(judge, rows, response[rows], response_len[rows])

    sampled = valid & ~final
    too_long = sampled & (prompt_len[:, None] + pos + 1 > max_prompt_len)
    valid &= ~too_long
    rows, ks = np.nonzero(sampled & ~too_long)  # row-major: the order of sampling
    if len(rows):
        prompts, lengths = prefix_prompts(prompt, prompt_len, response, rows, pos[rows, ks],
                                          width=max_prompt_len, pad_id=pad_id)
        labels[rows, ks] = _sample_fractions(
            generate=generate, params=params, prompts=prompts, lengths=lengths, rows=rows,
            pos=pos[rows, ks], response=response, judge=judge,
            num_completions=num_completions, chunk=chunk, pad_id=pad_id, key=key)
    return MCLabels(pos.astype(np.int32), valid, labels, int(len(rows) * num_completions),
                    int(too_long.sum()))


__all__ = ["Judge", "MCLabels", "continued", "monte_carlo_labels", "prefix_prompts"]
