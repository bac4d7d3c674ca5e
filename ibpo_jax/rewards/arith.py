"""The `arith` checker (ibpo_jax.data.arith.check) as a reward: final-answer correctness, with
the first wrong step (the step-level ground truth) in the info."""

from __future__ import annotations

from ibpo_jax.config.registry import REWARDS
from ibpo_jax.data import arith


@REWARDS.register("arith")
def arith_reward(record: dict, response: str) -> tuple[bool, dict]:
    """Verifier: correct iff the final "Answer: N" line is right (see arith.check)."""
    verdict = arith.check(response, record)
    return verdict.correct, {"reason": verdict.reason, "answer": verdict.answer,
                             "first_wrong_step": verdict.first_wrong_step}
