"""Continuations of response prefixes (host side): a prefix of a sampled response becomes a
prompt of its own (`prefix_prompts`), the sampler continues it, and the judge scores prefix +
continuation as a whole response (`continued`, `sample_fractions`). Shared by the PRM's
Monte-Carlo labels (`methods.prm.labels`) and the `vouched_steps` operator (`trainer.vouch`).

Prefixes are sampled `chunk` at a time, the last chunk padded with copies of its first prefix,
so the sampler compiles once for every call with the same shapes. Deterministic given `key`
(chunk c samples with fold_in(key, c)).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ibpo_jax.runtime import sharding

# judge(rows [m] index of the originating response, tokens [m, L] int32 (pad after each
# length), lengths [m]) -> [m] bool: is this full response correct.
Judge = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

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


def judged(judge: Judge, rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray
           ) -> np.ndarray:
    ok = np.asarray(judge(rows, tokens, lengths), dtype=bool)
    if ok.shape != rows.shape:
        raise ValueError(f"judge returned shape {ok.shape}, expected {rows.shape}")
    return ok


def sample_fractions(*, generate: Callable, params: Any, prompts: np.ndarray,
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
        ok = judged(judge, src, full, full_len)
        out[sl] = ok.reshape(real, num_completions).mean(axis=1)
    return out


__all__ = ["Judge", "continued", "judged", "prefix_prompts", "sample_fractions"]
