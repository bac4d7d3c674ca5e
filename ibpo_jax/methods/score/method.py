"""SCoRe+GRPO (DESIGN §7): a second attempt at every response, prompted with the problem, the
first attempt and a fixed self-correction instruction (`data.followups.retry_prompt`), as an
extra round of the RL step. Stage I (steps <= score.stage1_steps): the first attempts carry no
advantage and a KL anchor of weight score.stage1_kl to the base; the second attempts train on
r(y₂). Stage II: both train, the second on r(y₂) + α · (r(y₂) − r(y₁)). GRPO advantages within
each attempt's group. The method's answer is its second attempt: evaluation scores it
(`answer`), the first attempts' accuracy is eval_accuracy_attempt1.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ibpo_jax.config import ConfigError
from ibpo_jax.config.registry import METHODS
from ibpo_jax.data import followups
from ibpo_jax.trainer.batching import decode_responses, score_shared
from ibpo_jax.trainer.hooks import Method, Scored
from ibpo_jax.trainer.rounds import TEMPLATE_ROOM, FirstRound, Round, slot_arrays


@METHODS.register("score")
class Score(Method):
    """SCoRe's second attempts (an `ExtraRound` and an `Answerer`)."""

    switch = "config.score.enabled"
    trajectories_per_row = 1  # one second attempt per response

    @classmethod
    def enabled(cls, cfg: Any) -> bool:
        return cfg.score.enabled

    @classmethod
    def check(cls, cfg: Any) -> None:
        """Stage II must start before the run ends: at train.steps, or at the budget."""
        steps, why = cfg.train.steps, f"config.train.steps={cfg.train.steps}"
        if cfg.train.budget > 0:
            per_step = cfg.trajectories_per_step
            by_budget = -(-cfg.train.budget // per_step)
            if by_budget < steps:
                steps, why = by_budget, (f"config.train.budget={cfg.train.budget} "
                                         f"({by_budget} steps of {per_step} trajectories)")
        if cfg.score.stage1_steps >= steps:
            raise ConfigError(f"config.score.stage1_steps={cfg.score.stage1_steps}: the run "
                              f"ends after {steps} steps ({why}), so stage II would never run")

    @property
    def width(self) -> int:
        """Prompt columns of a second attempt: the problem, the first attempt, the template."""
        r = self.ctx.cfg.rollout
        return r.max_prompt_len + r.max_new_tokens + TEMPLATE_ROOM

    def extend(self, batch: Scored, first: FirstRound, key: jax.Array) -> Round:
        ctx, sc = self.ctx, self.ctx.cfg.score
        g, n = ctx.cfg.rollout.group_size, len(first.reward)
        texts = [followups.retry_prompt(ctx.task, first.records[i // g], attempt=t)
                 for i, t in enumerate(first.texts)]
        got = ctx.sample_round(batch.params, texts, self.width, key, n)
        records = [first.records[i // g] for i in range(n)]
        reward, correct, ended = ctx.score_shared(records, got.response, got.response_len)
        stage1 = batch.step <= sc.stage1_steps
        if not stage1:
            reward = reward + sc.alpha * (reward - first.reward)
        rows = slot_arrays(n, np.arange(n), got, reward, correct, ended, ctx.tokenizer.pad_id)
        anchor = np.concatenate([np.full(n, sc.stage1_kl if stage1 else 0.0), np.zeros(n)])
        c1 = first.correct
        metrics = {
            "score_stage": 1.0 if stage1 else 2.0,
            "attempt1_accuracy": float(np.mean(c1)),
            "attempt2_accuracy": float(np.mean(correct)),
            "flip_wrong_to_right": float(np.mean(~c1 & correct)),
            "flip_right_to_wrong": float(np.mean(c1 & ~correct)),
            "attempt2_prompts_truncated": float(got.truncated),
        }
        return Round(rows, metrics, float(n), kl_anchor=anchor, train_first=not stage1)

    def answer(self, params: Any, records: list[dict], texts: list[str], key: jax.Array
               ) -> np.ndarray:
        """Whether the second attempt after each first-attempt text is correct (evaluation
        sampler settings, the evaluation task)."""
        ctx = self.ctx
        prompts = [followups.retry_prompt(ctx.eval_task, r, attempt=t)
                   for r, t in zip(records, texts)]
        got = ctx.sample_round(params, prompts, self.width, key, len(prompts), evaluation=True)
        return score_shared(ctx.eval_pool, records, decode_responses(
            ctx.tokenizer, got.response, got.response_len))[1]
