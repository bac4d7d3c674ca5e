"""The `countdown` checker (ibpo_jax.data.countdown.check) as a reward: right iff every line is
right and the answer line names the target reached; the first wrong step in the info."""

from __future__ import annotations

from ibpo_jax.config.registry import REWARDS
from ibpo_jax.data import countdown


@REWARDS.register("countdown")
def countdown_reward(record: dict, response: str) -> tuple[bool, dict]:
    """Verifier: the whole derivation is checked, not only the answer (see countdown.check)."""
    verdict = countdown.check(response, record)
    return verdict.correct, {"reason": verdict.reason, "answer": verdict.answer,
                             "first_wrong_step": verdict.first_wrong_step}
