"""The reward interface: (prompt record, response text) -> RewardResult(reward, info).

A verifier (an entry of `registry.REWARDS`) decides correctness:
    verifier(record, response, **options) -> (correct: bool, info: dict with "reason", "answer")
`get_reward(name, ...)` wraps it in a `Reward`, a picklable callable that maps the verdict to the
terminal reward R ∈ {wrong, correct} (DESIGN §1: {-1, +1} by default; `values` makes the
{0, 1} -> R mapping configurable), turns an exception into `wrong` with the reason, and adds
"correct" and "time_s" (seconds) to the info. Hangs are handled one level up, by RewardPool.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from ibpo_jax.config.registry import REWARDS


@dataclasses.dataclass(frozen=True)
class RewardResult:
    """reward: float, one of the Reward's `values`; info: reason, answer, correct, time_s, ..."""

    reward: float
    info: dict


@dataclasses.dataclass(frozen=True)
class Reward:
    """A verifier bound to its value mapping and options; picklable when the verifier is a
    module-level function (worker processes import its module, which registers it again)."""

    name: str
    verifier: Callable[..., tuple[bool, dict]]
    values: tuple[float, float] = (-1.0, 1.0)  # (wrong, correct)
    options: tuple[tuple[str, Any], ...] = ()

    def __call__(self, record: dict, response: str) -> RewardResult:
        start = time.perf_counter()
        try:
            correct, info = self.verifier(record, response, **dict(self.options))
        except Exception as e:  # noqa: BLE001 - a broken reward must never kill the run
            correct, info = False, {"reason": f"reward {self.name!r} raised "
                                              f"{type(e).__name__}: {e}", "answer": None}
        return self.result(bool(correct), {**info, "time_s": time.perf_counter() - start})

    def result(self, correct: bool, info: dict) -> RewardResult:
        """The RewardResult for a verdict (also used by RewardPool for hangs and crashes)."""
        return RewardResult(self.values[int(correct)], {**info, "correct": correct})


def get_reward(name: str, *, values: tuple[float, float] = (-1.0, 1.0), **options) -> Reward:
    """The Reward for REWARDS entry `name`; `options` go to the verifier (e.g. timeout_s).

    values = (reward when wrong, reward when correct); (0.0, 1.0) gives the verifier's own
    {0, 1} scale.
    """
    if len(values) != 2:
        raise ValueError(f"get_reward: values must be (wrong, correct), got {values!r}")
    verifier = REWARDS.get(name, key="reward")
    return Reward(name=name, verifier=verifier, values=(float(values[0]), float(values[1])),
                  options=tuple(sorted(options.items())))
