"""Host-side batching around the sampler: the run's sampler settings, prompt records ->
left-padded token arrays, responses -> text and scores.

Prompts are right-aligned in a [B, P] array (left padding) so every response starts at
column P; the sampler, the trainer's log-prob pass and the comparison kernel all rely on that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import refill, sampling


class PromptBatch(NamedTuple):
    tokens: np.ndarray  # [B, P] int32, left-padded with pad_id
    lengths: np.ndarray  # [B] int32
    truncated: int  # prompts longer than P, cut from the left (counted in the metrics)


def encode_prompts(tokenizer: Any, texts: Sequence[str], max_len: int) -> PromptBatch:
    """Tokenizes `texts` (BOS prepended when the tokenizer has one) into a [B, max_len] batch."""
    out = np.full((len(texts), max_len), tokenizer.pad_id, np.int32)
    lengths = np.zeros(len(texts), np.int32)
    truncated = 0
    for row, text in enumerate(texts):
        ids = list(tokenizer.encode(text))
        if tokenizer.bos_id is not None:
            ids = [tokenizer.bos_id, *ids]
        if len(ids) > max_len:
            truncated += 1
            ids = ids[-max_len:]
        if ids:
            out[row, max_len - len(ids):] = ids
        lengths[row] = len(ids)
    return PromptBatch(out, lengths, truncated)


def decode_responses(tokenizer: Any, tokens: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Response texts: each row's first `length` tokens, without the final EOS token."""
    eos = set(tokenizer.eos_ids)
    texts = []
    for row, n in zip(tokens, lengths):
        ids = row[: int(n)].tolist()
        if ids and ids[-1] in eos:
            ids = ids[:-1]
        texts.append(tokenizer.decode(ids))
    return texts


def sampler(cfg: Any, model: Any, options: Any, tokenizer: Any, mesh: Any, *,
            num_samples: int, evaluation: bool = False, refill_slots: bool = False,
            max_new_tokens: int | None = None) -> sampling.GenerateFn:
    """The run's sampler (`sampling.generate_fn`, cached per configuration) with the rollout's
    settings or, `evaluation`, the evaluation's (`RunConfig.sampling`), `num_samples` responses
    per prompt, `max_new_tokens` (partial rollouts' rounds) in place of the settings'.
    `refill_slots` (the step's rollout with rollout.refill): decoding sample_chunk x
    group_size slots refilled from the call's queue of rows (`refill.refill_fn`)."""
    kwargs = dict(cfg.sampling(evaluation=evaluation), num_samples=num_samples,
                  eos_ids=tuple(tokenizer.eos_ids), pad_id=tokenizer.pad_id, mesh=mesh)
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    if refill_slots:
        slots = cfg.rollout.sample_chunk * cfg.rollout.group_size
        return refill.refill_fn(model, options, slots=slots, **kwargs)
    return sampling.generate_fn(model, options, **kwargs)


def ended(tokenizer: Any, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """[n] bool: the response's last token is an EOS (not cut at max_new_tokens)."""
    last_token = tokens[np.arange(len(tokens)), np.maximum(lengths - 1, 0)]
    return np.isin(last_token, tokenizer.eos_ids) & (lengths > 0)


def score_rows(pool: Any, tokenizer: Any, records: Sequence[dict], tokens: np.ndarray,
               lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]:
    """Rewards, correctness, ended-with-EOS and the verifier's reports of rows this process
    holds (tokens [n, R], lengths [n])."""
    reward, infos = pool.score(records, decode_responses(tokenizer, tokens, lengths))
    correct = np.array([bool(i["correct"]) for i in infos], bool)
    return reward, correct, ended(tokenizer, tokens, lengths), infos


def score_all_rows(pool: Any, tokenizer: Any, records: Sequence[dict], tokens: np.ndarray,
                   lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rewards, correctness and ended-with-EOS of rows that every process holds (extra
    rounds): each process scores its share (`score_shared`)."""
    reward, correct = score_shared(pool, records, decode_responses(tokenizer, tokens, lengths))
    return reward, correct, ended(tokenizer, tokens, lengths)


def score_shared(pool: Any, records: Sequence[dict], texts: Sequence[str]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(reward float32 [n], correct bool [n]) of n (record, text) pairs that every process
    holds (evaluation, second rounds): each process scores its `process_share` and all
    receive the whole, so k hosts score n / k each instead of n."""
    mine = sharding.process_share(len(records))
    reward, infos = pool.score([records[i] for i in mine], [texts[i] for i in mine])
    correct = np.array([bool(i["correct"]) for i in infos], bool)
    return (sharding.gather_shares(reward, len(records)),
            sharding.gather_shares(correct, len(records)))


def encode_supervised(tokenizer: Any, prompts: Sequence[str], targets: Sequence[str],
                      *, max_prompt_len: int, max_target_len: int) -> tuple[np.ndarray, ...]:
    """Teacher-forcing batch for the warm start: [B, P + T] tokens and a target-token mask.

    The prompt is left-padded to P exactly as in RL, so the warm-started policy sees the same
    layout it will be sampled with; targets end with EOS and are right-padded.
    """
    prompt = encode_prompts(tokenizer, prompts, max_prompt_len)
    target = np.full((len(targets), max_target_len), tokenizer.pad_id, np.int32)
    target_mask = np.zeros((len(targets), max_target_len), bool)
    for row, text in enumerate(targets):
        ids = [*tokenizer.encode(text), tokenizer.eos_id][:max_target_len]
        target[row, : len(ids)] = ids
        target_mask[row, : len(ids)] = True
    prompt_mask = np.arange(max_prompt_len)[None, :] >= (max_prompt_len - prompt.lengths)[:, None]
    tokens = np.concatenate([prompt.tokens, target], axis=1)
    attention = np.concatenate([prompt_mask, target_mask], axis=1)
    loss_mask = np.concatenate([np.zeros_like(prompt_mask), target_mask], axis=1)
    return tokens, attention, loss_mask
