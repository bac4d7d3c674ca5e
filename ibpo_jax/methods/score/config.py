"""The `score` config section: SCoRe's two attempts and stages (DESIGN §7). Registered in
`registry.SECTIONS`, `RunConfig` composes it as `config.score`; the method that reads it is
`methods.score.method`."""

from __future__ import annotations

import dataclasses

from ibpo_jax.config.registry import SECTIONS
from ibpo_jax.config.schema import Section


@dataclasses.dataclass(frozen=True)
class ScoreConfig(Section):
    KEY = "score"
    enabled: bool = False
    """SCoRe (DESIGN §7): each response gets a second attempt, prompted with the problem, the
    first attempt and a fixed self-correction instruction (configs/score_grpo.py sets it)."""
    stage1_steps: int = 50
    """Stage I: RL steps training the second attempt only, with the first attempts held to
    the base policy by a KL of weight stage1_kl; stage II (the rest) trains both attempts."""
    stage1_kl: float = 0.1
    """Per-row KL(π ‖ π_base) weight on the first attempts in stage I."""
    alpha: float = 1.0
    """Stage II's bonus on the second attempt: r(y₂) + α · (r(y₂) − r(y₁))."""

    def check(self):
        self._nonneg("stage1_steps", "stage1_kl", "alpha")


SECTIONS.register(ScoreConfig.KEY)(ScoreConfig)  # RunConfig's `config.score`
