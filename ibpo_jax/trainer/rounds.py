"""Second rounds of an RL step: Appendix B's corrections (DESIGN §6) and SCoRe's second
attempts (DESIGN §7).

A second round builds prompts on the host from the first round's texts (`data.followups`),
samples one response to each with the rollout's sampler settings, scores it with the same
verifier and lays the results out as rollout rows in a [B, G] slot layout: slot (b, g) holds
the second-round response that follows first-round response g of prompt b, or nothing
(`Rollout.valid` False: no tokens, no advantage, outside the group statistics). Its credit
is the run's own (`step.credit`, normalized within the second round's groups), and its rows
are appended to the first round's for one update (`joined`), so they train with the run's
objective, conditioned on their own, longer prompts.

Prompt counts vary per step; they are padded up to multiples of N / BUCKETS rows so that the
sampler compiles a few shapes at most. Every process builds the same host arrays (the second
round's rows are scored on every process).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ibpo_jax import sampling, sharding
from ibpo_jax.data import followups
from ibpo_jax.trainer.batching import decode_responses, encode_prompts, score_shared
from ibpo_jax.trainer.credit import Credit, Rollout

CORRECTION_COST = 1.2  # trajectories per correction generation (Appendix B: longer context)
BUCKETS = 8
TEMPLATE_ROOM = 64  # prompt tokens a template adds around the texts it quotes


@dataclasses.dataclass(frozen=True)
class FirstRound:
    """What a second round reads of the first, on the host (every row, prompt-major)."""

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


def correction_pairs(correct: np.ndarray, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(wrong rows, peers): each wrong response of a group with a correct one, and a correct
    response of its group drawn uniformly (DESIGN §6). correct: [B, G] bool; rows flat."""
    wrong, peers = [], []
    g = correct.shape[1]
    for b, row in enumerate(correct):
        right = np.flatnonzero(row)
        if not len(right):
            continue  # nothing to correct with
        for i in np.flatnonzero(~row):
            wrong.append(b * g + i)
            peers.append(b * g + int(rng.choice(right)))
    return np.asarray(wrong, np.int64), np.asarray(peers, np.int64)


def padded_count(m: int, n: int) -> int:
    """m prompts padded up to a multiple of N / BUCKETS (at least one bucket)."""
    unit = max(1, n // BUCKETS)
    return max(unit, -(-m // unit) * unit)


class Sampled(NamedTuple):
    """A second round's prompts and responses on the host, one row per prompt."""

    prompt: np.ndarray  # [m, W] int32, left-padded
    prompt_len: np.ndarray  # [m]
    response: np.ndarray  # [m, R]
    response_len: np.ndarray  # [m]
    sample_logp: np.ndarray  # [m, R]
    truncated: int  # prompts cut from the left to W tokens


def sample_round(trainer: Any, texts: list[str], width: int, key: jax.Array, n: int, *,
                 evaluation: bool = False) -> Sampled:
    """One sample for each prompt text with the rollout's sampler settings (`evaluation`: the
    evaluation's), the prompt count padded as `padded_count(len(texts), n)` (n: first-round
    rows)."""
    cfg, tok, m = trainer.cfg, trainer.tokenizer, len(texts)
    if not m:
        r = cfg.rollout.max_new_tokens
        return Sampled(np.zeros((0, width), np.int32), np.zeros(0, np.int32),
                       np.zeros((0, r), np.int32), np.zeros(0, np.int32),
                       np.zeros((0, r), np.float32), 0)
    prompts = encode_prompts(tok, texts, width)
    pad = padded_count(m, n) - m  # copies of the first prompt: one compiled shape per bucket
    prompts = prompts._replace(tokens=np.concatenate([prompts.tokens, prompts.tokens[:1].repeat(
        pad, 0)]), lengths=np.concatenate([prompts.lengths, prompts.lengths[:1].repeat(pad)]))
    e, r = cfg.eval, cfg.rollout
    settings = (dict(max_new_tokens=e.max_new_tokens or r.max_new_tokens,
                     temperature=e.temperature, top_p=e.top_p) if evaluation else
                dict(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                     top_k=r.top_k))
    generate = sampling.generate_fn(trainer.base.config, trainer.base.options, **settings,
                                    eos_ids=tuple(tok.eos_ids), pad_id=tok.pad_id,
                                    num_samples=1, mesh=trainer.mesh)
    with jax.set_mesh(trainer.mesh):
        out = generate(trainer.state.params, prompts.tokens, prompts.lengths, key)
    tokens, lengths, logp = (sharding.host_array(x)[:m]
                             for x in (out.tokens, out.lengths, out.logprobs))
    return Sampled(prompts.tokens[:m], prompts.lengths[:m], tokens, lengths, logp,
                   prompts.truncated)


def slot_arrays(n: int, slots: np.ndarray, got: Sampled, reward: np.ndarray,
                correct: np.ndarray, ended: np.ndarray, pad_id: int) -> dict[str, np.ndarray]:
    """Host arrays of a second round in the [N] slot layout: row slots[k] holds result k; the
    other rows are invalid (a one-token pad prompt, no response)."""
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


def first_round(trainer: Any, records: list[dict], rollout: Rollout) -> FirstRound:
    """The first round's rows on the host (gathered on every process)."""
    host = {k: sharding.host_array(v) for k, v in rollout._asdict().items() if v is not None}
    texts = decode_responses(trainer.tokenizer, host["response"], host["response_len"])
    return FirstRound(records, host["prompt"], host["prompt_len"], host["response"],
                      host["response_len"], host["sample_logp"],
                      host["reward"].astype(np.float32), host["correct"], host["ended"], texts)


def _left_pad(prompt: np.ndarray, width: int, pad_id: int) -> np.ndarray:
    """[n, P] left-padded prompts -> [n, width] (width >= P)."""
    return np.concatenate(
        [np.full((len(prompt), width - prompt.shape[1]), pad_id, prompt.dtype), prompt], 1)


def _place(arrays: dict[str, np.ndarray], mesh: Any) -> Rollout:
    place = lambda x: sharding.global_array(x, sharding.batch_sharding(mesh, np.ndim(x)))
    return Rollout(**{k: place(v) for k, v in arrays.items()})


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
    return _place(out, mesh)


def _credit(trainer: Any, second: dict[str, np.ndarray]) -> Credit:
    """The run's credit of the second round's rows, within its own groups."""
    with jax.set_mesh(trainer.mesh):
        cred, _ = trainer.credit_fn(_place(second, trainer.mesh), trainer.is_delim)
    return cred


def _concat_credit(a: Credit, b: Credit) -> Credit:
    return Credit(*(jnp.concatenate([x, y]) for x, y in zip(a, b)))


class Extension(NamedTuple):
    rollout: Rollout  # the update's rows: first round, then second
    cred: Credit
    metrics: dict[str, float]
    cost: float  # trajectories the second round sampled, weighted (DESIGN §6)


@dataclasses.dataclass(frozen=True)
class Corrections:
    """DESIGN §6: one corrected output per wrong response with a correct peer, prompted with
    the problem, the wrong response and a correct response of its group drawn at random."""

    def extend(self, trainer: Any, s: int, key: jax.Array, first: FirstRound,
               cred: Credit) -> Extension:
        cfg, g, n = trainer.cfg, trainer.cfg.rollout.group_size, len(first.reward)
        wrong, peers = correction_pairs(first.correct.reshape(-1, g),
                                        np.random.default_rng([cfg.seed, s, 6]))
        texts = [followups.correction_prompt(trainer.task, first.records[i // g],
                                             wrong=first.texts[i], right=first.texts[j])
                 for i, j in zip(wrong, peers)]
        width = cfg.rollout.max_prompt_len + 2 * cfg.rollout.max_new_tokens + TEMPLATE_ROOM
        got = sample_round(trainer, texts, width, key, n)
        reward, correct, ended = trainer.score_all([first.records[i // g] for i in wrong],
                                                   got.response, got.response_len)
        second = slot_arrays(n, wrong, got, reward, correct, ended, trainer.tokenizer.pad_id)
        rollout = joined(first, second, trainer.mesh, trainer.tokenizer.pad_id)
        m, tokens = len(wrong), int(got.response_len.sum())
        metrics = {
            "corrections": float(m),
            "corrections_accuracy": float(np.mean(correct)) if m else float("nan"),
            "corrections_token_share": tokens / max(tokens + int(first.response_len.sum()), 1),
            "corrections_cost": CORRECTION_COST * m,
            "corrections_prompts_truncated": float(got.truncated),
        }
        return Extension(rollout, _concat_credit(cred, _credit(trainer, second)), metrics,
                         CORRECTION_COST * m)


@dataclasses.dataclass(frozen=True)
class Score:
    """DESIGN §7, SCoRe: a second attempt at every response, prompted with the problem, the
    first attempt and a fixed self-correction instruction. Stage I (steps <=
    score.stage1_steps): the first attempts carry no advantage and a KL anchor of weight
    score.stage1_kl to the base; the second attempts train on r(y₂). Stage II: both train,
    the second on r(y₂) + α · (r(y₂) − r(y₁)). GRPO advantages within each attempt's group."""

    def extend(self, trainer: Any, s: int, key: jax.Array, first: FirstRound,
               cred: Credit) -> Extension:
        cfg, g, n = trainer.cfg, trainer.cfg.rollout.group_size, len(first.reward)
        texts = [followups.retry_prompt(trainer.task, first.records[i // g], attempt=t)
                 for i, t in enumerate(first.texts)]
        width = cfg.rollout.max_prompt_len + cfg.rollout.max_new_tokens + TEMPLATE_ROOM
        got = sample_round(trainer, texts, width, key, n)
        rows = [first.records[i // g] for i in range(n)]
        reward, correct, ended = trainer.score_all(rows, got.response, got.response_len)
        stage1 = s <= cfg.score.stage1_steps
        if not stage1:
            reward = reward + cfg.score.alpha * (reward - first.reward)
        second = slot_arrays(n, np.arange(n), got, reward, correct, ended,
                             trainer.tokenizer.pad_id)
        anchor = np.concatenate([np.full(n, cfg.score.stage1_kl if stage1 else 0.0),
                                 np.zeros(n)])
        rollout = joined(first, second, trainer.mesh, trainer.tokenizer.pad_id, anchor)
        if stage1:
            cred = cred._replace(adv=jnp.zeros_like(cred.adv))
        c1 = first.correct
        metrics = {
            "score_stage": 1.0 if stage1 else 2.0,
            "attempt1_accuracy": float(np.mean(c1)),
            "attempt2_accuracy": float(np.mean(correct)),
            "flip_wrong_to_right": float(np.mean(~c1 & correct)),
            "flip_right_to_wrong": float(np.mean(c1 & ~correct)),
            "attempt2_prompts_truncated": float(got.truncated),
        }
        return Extension(rollout, _concat_credit(cred, _credit(trainer, second)), metrics,
                         float(n))


def second_attempts(trainer: Any, records: list[dict], texts: list[str],
                    key: jax.Array) -> np.ndarray:
    """Evaluation of SCoRe's answer: whether the second attempt after each first-attempt text
    is correct (evaluation sampler settings)."""
    cfg = trainer.cfg
    prompts = [followups.retry_prompt(trainer.eval_task, r, attempt=t)
               for r, t in zip(records, texts)]
    width = cfg.rollout.max_prompt_len + cfg.rollout.max_new_tokens + TEMPLATE_ROOM
    got = sample_round(trainer, prompts, width, key, len(prompts), evaluation=True)
    return score_shared(trainer.eval_pool, records, decode_responses(
        trainer.tokenizer, got.response, got.response_len))[1]


def second_round(cfg: Any) -> Corrections | Score | None:
    """The run's second round, if any."""
    if cfg.ibpo.correction_rollouts:
        return Corrections()
    if cfg.score.enabled:
        return Score()
    return None
