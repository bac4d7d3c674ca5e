"""Verifiable rewards: (prompt record, response text) -> terminal reward in {-1, +1} and info.

Importing this package registers the verifiers in ``registry.REWARDS`` (each procedural task's
step checker, `arith` and `countdown`, is registered by its task: `data.tasks`):
  math    last \\boxed{} / answer line, math-verify with a time limit, string fallback
  code    the response's last ```python block run against the record's tests in a sandbox

``get_reward(name)`` gives a picklable callable, ``RewardPool`` scores batches in parallel
worker processes with per-response timeouts.
"""

from ibpo_jax.rewards import code, math_answer  # noqa: F401 - registers them
from ibpo_jax.rewards.base import Reward, RewardResult, get_reward
from ibpo_jax.rewards.code import CodeResult, run_tests
from ibpo_jax.rewards.pool import RewardPool

__all__ = ["CodeResult", "Reward", "RewardPool", "RewardResult", "get_reward", "run_tests"]
