"""`StepSpec`: the static configuration of the step's jitted functions (`credit.credit`,
`step.update`), in a module of its own so that both import it one way."""

from __future__ import annotations

import dataclasses
from typing import Any

from ibpo_jax import config, models
from ibpo_jax.core import losses


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Static (hashable) configuration of the jitted step functions: the config sections the
    step reads, as they are, plus the few values derived from the run."""

    model: models.Qwen3Config
    options: models.ModelOptions
    rollout: config.RolloutConfig
    ibpo: config.IbpoConfig
    advantage: config.AdvantageConfig
    loss: losses.LossSpec  # config.loss with the run's loss name and norm_const resolved
    cancellation: config.CancellationConfig
    optim: config.OptimConfig
    diagnostics: config.DiagnosticsConfig
    layout: str  # RunConfig.update_layout: "grouped", "packed" or "rows" (trainer/step.py)
    logits_chunk: int  # config.model.logits_chunk

    @classmethod
    def from_config(cls, cfg: config.RunConfig, model: models.Qwen3Config,
                    options: models.ModelOptions) -> StepSpec:
        name = cfg.loss.name
        if name == "gspo" and cfg.ibpo.credit == "token":
            name = "gspo_token"  # per-token credit needs GSPO's token form (DESIGN §4)
        loss = dataclasses.replace(
            cfg.loss, name=name,
            norm_const=cfg.loss.norm_const or float(cfg.rollout.max_new_tokens))
        return cls(model=model, options=options, rollout=cfg.rollout, ibpo=cfg.ibpo,
                   advantage=cfg.advantage, loss=loss, cancellation=cfg.cancellation,
                   optim=cfg.optim, diagnostics=cfg.diagnostics, layout=cfg.update_layout,
                   logits_chunk=cfg.model.logits_chunk)

    def with_optim(self, **changes: Any) -> StepSpec:
        """This spec with some optim fields changed (e.g. microbatches: the resolved count,
        which then stands for optim.micro_batch_rows too)."""
        if "microbatches" in changes:
            changes.setdefault("micro_batch_rows", 0)
        return dataclasses.replace(self, optim=dataclasses.replace(self.optim, **changes))

    @property
    def group_size(self) -> int:
        return self.rollout.group_size

    @property
    def temperature(self) -> float:
        """The sampler's temperature (greedy rollouts are scored at 1)."""
        return self.rollout.temperature or 1.0

    @property
    def is_ppo(self) -> bool:
        return self.loss.name == "ppo"

    @property
    def estimator(self) -> str:
        """The registry.ESTIMATORS name of the run's estimator (DESIGN §3): the config's
        `advantage.estimator`, or for "auto" GAE with PPO, grpo_token with token credit, else
        grpo."""
        if self.advantage.estimator != "auto":
            return self.advantage.estimator
        return "gae" if self.is_ppo else "grpo_token" if self.ibpo.credit == "token" else "grpo"

    @property
    def kl_in_loss(self) -> bool:
        """β·KL is a term of the loss: the update runs π_ref's forward pass."""
        return self.loss.beta > 0 and self.loss.kl_in == "loss"

    @property
    def kl_in_reward(self) -> bool:
        """β·KL comes off the reward: `step.reward_kl` runs π_ref's pass before `credit`."""
        return self.loss.beta > 0 and self.loss.kl_in == "reward"

    @property
    def single_update(self) -> bool:
        """One optimizer update per rollout: π_old is the policy being differentiated. Not
        with LoRA dropout: π_old is then a pass without it (the gradient passes have it)."""
        return (self.optim.epochs * self.optim.minibatches == 1 and not self.is_ppo
                and not self.options.lora_dropout)
