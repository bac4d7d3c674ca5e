"""Extra rounds of an RL step: the rows that a method's round (Appendix B's corrections,
DESIGN §6; SCoRe's second attempts, DESIGN §7) appends to the first round's for one update.

A round builds prompts on the host from the first round's texts (`FirstRound`), samples one
response to each with the rollout's sampler settings, scores it with the same verifier and lays
the results out as rollout rows in a [B, G] slot layout (`slot_arrays`): slot (b, g) holds the
response that follows first-round response g of prompt b, or nothing (`Rollout.valid` False: no
tokens, no advantage, outside the group statistics). The trainer credits the round's rows with
the run's own credit (`step.credit`, normalized within the round's groups) and appends them to
the first round's (`joined`, `joined_credit`), so they train with the run's objective,
conditioned on their own, longer prompts.

Prompt counts vary per step; they are padded up to multiples of N / BUCKETS rows
(`padded_count`) so that the sampler compiles a few shapes at most. Every process builds the
same host arrays (a round's rows are scored on every process).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ibpo_jax.runtime import sharding
from ibpo_jax.trainer.batching import decode_responses, encode_prompts
from ibpo_jax.trainer.credit import Credit, Rollout

BUCKETS = 8
TEMPLATE_ROOM = 64  # prompt tokens a template adds around the texts it quotes


@dataclasses.dataclass(frozen=True)
class FirstRound:
    """What an extra round reads of the first, on the host (every row, prompt-major)."""

    records: list[dict]  # [B] problems
    prompt: np.ndarray  # [N, P] int32, left-padded
    prompt_len: np.ndarray  # [N]
    response: np.ndarray  # [N, R]
    response_len: np.ndarray  # [N]
    sample_logp: np.ndarray  # [N, R]
    reward: np.ndarray  # [N] float32
    correct: np.ndarray  # [N] bool
    ended: np.ndarray  # [N] bool
    texts: list[str]  # [N] decoded responses


class Sampled(NamedTuple):
    """A round's prompts and responses on the host, one row per prompt."""

    prompt: np.ndarray  # [m, W] int32, left-padded
    prompt_len: np.ndarray  # [m]
    response: np.ndarray  # [m, R]
    response_len: np.ndarray  # [m]
    sample_logp: np.ndarray  # [m, R]
    truncated: int  # prompts cut from the left to W tokens


class Round(NamedTuple):
    """What a method's extra round hands the trainer (`trainer.hooks.ExtraRound`)."""

    rows: dict[str, np.ndarray]  # the round's rows in the [N] slot layout (`slot_arrays`)
    metrics: dict[str, float]
    cost: float  # trajectories the round sampled, weighted (DESIGN §6)
    kl_anchor: np.ndarray | None = None  # [2N] per-row KL-to-base weights of the joined rows
    train_first: bool = True  # False: the first round's rows carry no advantage


def padded_count(m: int, n: int) -> int:
    """m prompts padded up to a multiple of N / BUCKETS (at least one bucket)."""
    unit = max(1, n // BUCKETS)
    return max(unit, -(-m // unit) * unit)


def slot_arrays(n: int, slots: np.ndarray, got: Sampled, reward: np.ndarray,
                correct: np.ndarray, ended: np.ndarray, pad_id: int) -> dict[str, np.ndarray]:
    """Host arrays of a round in the [N] slot layout: row slots[k] holds result k; the other
    rows are invalid (a one-token pad prompt, no response)."""
    width, r = got.prompt.shape[1], got.response.shape[1]
    out = {
        "prompt": np.full((n, width), pad_id, np.int32), "prompt_len": np.ones(n, np.int32),
        "response": np.full((n, r), pad_id, np.int32), "response_len": np.zeros(n, np.int32),
        "sample_logp": np.zeros((n, r), np.float32), "reward": np.zeros(n, np.float32),
        "correct": np.zeros(n, bool), "ended": np.zeros(n, bool), "valid": np.zeros(n, bool)}
    for name, values in (("prompt", got.prompt), ("prompt_len", got.prompt_len),
                         ("response", got.response), ("response_len", got.response_len),
                         ("sample_logp", got.sample_logp), ("reward", reward),
                         ("correct", correct), ("ended", ended), ("valid", True)):
        out[name][slots] = values
    return out


def first_round(tokenizer: Any, records: list[dict], rollout: Rollout) -> FirstRound:
    """The first round's rows on the host (gathered on every process: a collective)."""
    host = {k: sharding.host_array(v) for k, v in rollout._asdict().items() if v is not None}
    texts = decode_responses(tokenizer, host["response"], host["response_len"])
    return FirstRound(records, host["prompt"], host["prompt_len"], host["response"],
                      host["response_len"], host["sample_logp"],
                      host["reward"].astype(np.float32), host["correct"], host["ended"], texts)


def _left_pad(prompt: np.ndarray, width: int, pad_id: int) -> np.ndarray:
    """[n, P] left-padded prompts -> [n, width] (width >= P)."""
    return np.concatenate(
        [np.full((len(prompt), width - prompt.shape[1]), pad_id, prompt.dtype), prompt], 1)


def place(arrays: dict[str, np.ndarray], mesh: Any) -> Rollout:
    """Host rows (every process holds them all) as a `Rollout` on the mesh."""
    put = lambda x: sharding.global_array(x, sharding.batch_sharding(mesh, np.ndim(x)))
    return Rollout(**{k: put(v) for k, v in arrays.items()})


def joined(first: FirstRound, second: dict[str, np.ndarray], mesh: Any, pad_id: int,
           kl_anchor: np.ndarray | None = None) -> Rollout:
    """The update's rollout: the first round's rows, then the second's (prompts left-padded
    to the wider width), placed on the mesh."""
    a = {"prompt": first.prompt, "prompt_len": first.prompt_len, "response": first.response,
         "response_len": first.response_len, "sample_logp": first.sample_logp,
         "reward": first.reward, "correct": first.correct, "ended": first.ended,
         "valid": np.ones(len(first.reward), bool)}
    width = max(a["prompt"].shape[1], second["prompt"].shape[1])
    out = {k: np.concatenate([_left_pad(a[k], width, pad_id),
                              _left_pad(second[k], width, pad_id)])
           if k == "prompt" else np.concatenate([a[k], second[k]]) for k in a}
    if kl_anchor is not None:
        out["kl_anchor"] = kl_anchor.astype(np.float32)
    return place(out, mesh)


def joined_credit(first: Credit, second: Credit, *, train_first: bool = True) -> Credit:
    """The update's credit, the rows of `joined`: the first round's (its advantages zeroed
    unless `train_first`), then the second's (credited within its own groups)."""
    if not train_first:
        first = first._replace(adv=jnp.zeros_like(first.adv))
    return Credit(*(jnp.concatenate([x, y]) for x, y in zip(first, second)))


def sample(generate: Any, params: Any, tokenizer: Any, texts: list[str], *, width: int,
           key: Any, n: int, mesh: Any, response_width: int) -> Sampled:
    """One sample of `generate` (num_samples 1) for each prompt text, prompts left-padded in
    `width` columns, their count padded as `padded_count(len(texts), n)` (n: first-round rows)
    with copies of the first (one compiled shape per bucket). No text: empty arrays,
    `response_width` columns."""
    m = len(texts)
    if not m:
        return Sampled(np.zeros((0, width), np.int32), np.zeros(0, np.int32),
                       np.zeros((0, response_width), np.int32), np.zeros(0, np.int32),
                       np.zeros((0, response_width), np.float32), 0)
    prompts = encode_prompts(tokenizer, texts, width)
    pad = padded_count(m, n) - m
    prompts = prompts._replace(tokens=np.concatenate([prompts.tokens, prompts.tokens[:1].repeat(
        pad, 0)]), lengths=np.concatenate([prompts.lengths, prompts.lengths[:1].repeat(pad)]))
    with jax.set_mesh(mesh):
        out = generate(params, prompts.tokens, prompts.lengths, key)
    tokens, lengths, logp = (sharding.host_array(x)[:m]
                             for x in (out.tokens, out.lengths, out.logprobs))
    return Sampled(prompts.tokens[:m], prompts.lengths[:m], tokens, lengths, logp,
                   prompts.truncated)
