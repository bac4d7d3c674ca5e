"""The `prm` config section: PRM+GSPO's process reward model (DESIGN §7). Registered in
`registry.SECTIONS`, `RunConfig` composes it as `config.prm`; the method that reads it is
`methods.prm.method`."""

from __future__ import annotations

import dataclasses

from ibpo_jax.config.registry import SECTIONS
from ibpo_jax.config.schema import Section


@dataclasses.dataclass(frozen=True)
class PrmConfig(Section):
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


SECTIONS.register(PrmConfig.KEY)(PrmConfig)  # RunConfig's `config.prm`
