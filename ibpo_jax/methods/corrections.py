"""Appendix B's correction rollouts (DESIGN §6), part of IBPO's method: after scoring, every
wrong response of a group that has a correct one gets one corrected output, sampled with the
rollout's sampler from a prompt quoting the problem, the wrong response and a correct response
of its group drawn at random (`data.followups.correction_prompt`), scored by the same verifier
and trained on as extra rows of the update, a group of corrections per prompt (slot g = the
correction of response g). Each counts CORRECTION_COST trajectories. Its switch is
`config.ibpo.correction_rollouts` (the key predates this module; it has no section of its own).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ibpo_jax.config.registry import METHODS
from ibpo_jax.data import followups
from ibpo_jax.trainer.hooks import Method, Scored
from ibpo_jax.trainer.rounds import TEMPLATE_ROOM, FirstRound, Round, slot_arrays

CORRECTION_COST = 1.2  # trajectories per correction generation (Appendix B: longer context)


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


@METHODS.register("corrections")
class Corrections(Method):
    """One corrected output per wrong response with a correct peer (an `ExtraRound`)."""

    switch = "config.ibpo.correction_rollouts"

    @classmethod
    def enabled(cls, cfg: Any) -> bool:
        return cfg.ibpo.correction_rollouts

    def extend(self, batch: Scored, first: FirstRound, key: jax.Array) -> Round:
        ctx, cfg = self.ctx, self.ctx.cfg
        g, n = cfg.rollout.group_size, len(first.reward)
        wrong, peers = correction_pairs(first.correct.reshape(-1, g),
                                        np.random.default_rng([cfg.seed, batch.step, 6]))
        texts = [followups.correction_prompt(ctx.task, first.records[i // g],
                                             wrong=first.texts[i], right=first.texts[j])
                 for i, j in zip(wrong, peers)]
        width = cfg.rollout.max_prompt_len + 2 * cfg.rollout.max_new_tokens + TEMPLATE_ROOM
        got = ctx.sample_round(batch.params, texts, width, key, n)
        reward, correct, ended = ctx.score_shared([first.records[i // g] for i in wrong],
                                                  got.response, got.response_len)
        m, tokens = len(wrong), int(got.response_len.sum())
        metrics = {
            "corrections": float(m),
            "corrections_accuracy": float(np.mean(correct)) if m else float("nan"),
            "corrections_token_share": tokens / max(tokens + int(first.response_len.sum()), 1),
            "corrections_cost": CORRECTION_COST * m,
            "corrections_prompts_truncated": float(got.truncated),
        }
        rows = slot_arrays(n, wrong, got, reward, correct, ended, ctx.tokenizer.pad_id)
        return Round(rows, metrics, CORRECTION_COST * m)
