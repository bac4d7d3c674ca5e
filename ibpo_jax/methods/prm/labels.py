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
from ibpo_jax.sampler.continuations import (  # noqa: F401  (re-exported: the labels' API)
    Judge,
    continued,
    judged,
    prefix_prompts,
    sample_fractions,
)

_step_ends = jax.jit(prm.step_ends, static_argnames="max_steps")


class MCLabels(NamedTuple):
    pos: np.ndarray  # [n, K] int32 response column of each step end (`model.step_ends`)
    valid: np.ndarray  # [n, K] bool, a labelled step (not a dropped prefix, not an empty slot)
    labels: np.ndarray  # [n, K] float32 in [0, 1], 0 where not valid
    cost: int  # sampled completions (trajectories), to charge to the rollout budget
    dropped: int  # step prefixes left out because prompt + prefix > max_prompt_len


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
    labels[rows, ks] = judged(judge, rows, response[rows], response_len[rows])

    sampled = valid & ~final
    too_long = sampled & (prompt_len[:, None] + pos + 1 > max_prompt_len)
    valid &= ~too_long
    rows, ks = np.nonzero(sampled & ~too_long)  # row-major: the order of sampling
    if len(rows):
        prompts, lengths = prefix_prompts(prompt, prompt_len, response, rows, pos[rows, ks],
                                          width=max_prompt_len, pad_id=pad_id)
        labels[rows, ks] = sample_fractions(
            generate=generate, params=params, prompts=prompts, lengths=lengths, rows=rows,
            pos=pos[rows, ks], response=response, judge=judge,
            num_completions=num_completions, chunk=chunk, pad_id=pad_id, key=key)
    return MCLabels(pos.astype(np.int32), valid, labels, int(len(rows) * num_completions),
                    int(too_long.sum()))


__all__ = ["Judge", "MCLabels", "continued", "monte_carlo_labels", "prefix_prompts",
           "sample_fractions"]
