"""Config sections of the Table 1 baselines that add a stage to the RL step (DESIGN §7):
the process reward model of PRM+GSPO and SCoRe's two attempts. Same conventions as
`config_sections.py`; `ibpo_jax.config` assembles them into `RunConfig`."""

from __future__ import annotations

import dataclasses

from ibpo_jax.config_sections import _Section


@dataclasses.dataclass(frozen=True)
class PrmConfig(_Section):
    KEY = "prm"
    weight: float = 0.0
    """λ_prm of r̃ = R + λ_prm · min_k PRM_k; 0 = no PRM (configs/prm_gspo.py sets it)."""
    num_prompts: int = 32
    """Training prompts whose sampled responses are labelled before RL."""
    samples: int = 4
    """Responses sampled (by the base policy) per labelled prompt."""
    completions: int = 4
    """N: Monte-Carlo completions rolled out from each step prefix; its label is the fraction
    reaching the right answer (they count in budget_trajectories)."""
    max_steps: int = 16
    """Step ends scored per response (the first ones)."""
    head_steps: int = 500
    """Full-batch Adam steps fitting the scalar head (binary cross-entropy)."""
    head_lr: float = 1e-2
    """Learning rate of the head's fit."""
    head_width: int = 64
    """Hidden width of the head's MLP (one GELU layer); 0 = a linear head."""

    def check(self):
        self._nonneg("weight")
        self._positive("num_prompts", "samples", "completions", "max_steps", "head_steps",
                       "head_lr")
        self._nonneg("head_width")


@dataclasses.dataclass(frozen=True)
class ScoreConfig(_Section):
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
