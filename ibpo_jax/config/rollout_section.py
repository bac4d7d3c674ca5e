"""The `rollout` config section: how a step samples its responses (the sampler's settings,
chunks or slot refill, dynamic sampling, off-policy). Its own module, like `logging_section.py`,
to keep `config/sections.py` small."""

from __future__ import annotations

import dataclasses

from ibpo_jax.config.schema import Section


@dataclasses.dataclass(frozen=True)
class RolloutConfig(Section):
    KEY = "rollout"
    prompts_per_step: int = 16
    """Prompts per RL step (B); the step samples B x G responses."""
    group_size: int = 8
    """G, responses per prompt."""
    max_prompt_len: int = 64
    """Prompts are left-truncated to this many tokens."""
    max_new_tokens: int = 64
    """Response length limit (responses cut here count as truncated)."""
    temperature: float = 1.0
    """0 = greedy, else >= MIN_TEMPERATURE."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]; 1 = off."""
    top_k: int = 0
    """0 = off."""
    sample_chunk: int = 0
    """Prompts per sampler call, 0 = all prompts_per_step at once: the KV cache of every row
    at once (B·G rows of prompt + response tokens) is what long rollouts cannot hold, so they
    sample the step's prompts a chunk at a time (`python -m ibpo_jax.plan` sizes it)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop the groups whose raw outcome R (the verifier's, never a
    shaped reward) is all-equal and sample B more prompts, up to max_sampling_rounds rounds,
    until B mixed groups are found (trainer/dynamic.py); every sample counts in the budget."""
    max_sampling_rounds: int = 3
    """Sampling rounds per step with dynamic_sampling (>= 1, the first included); short of B
    mixed groups the step fills with filtered groups that carry no loss (`groups_mixed`)."""
    refill: bool = False
    """Slot refill (sampler/refill.py): the step's B x G rows form a queue and decode keeps
    sample_chunk x G slots busy, a finished row's slot taking the next waiting row, instead of
    decoding chunks until their longest row ends; the same samples as one call over all
    prompts. Needs 0 < sample_chunk < prompts_per_step. Off by default: it saves decode steps
    but on XLA:CPU runs slower (experiments/benchmarks/RESULTS.md), and no accelerator has
    measured it yet."""
    off_policy_steps: int = 0
    """1: the batch of step k+1 is sampled and scored with the parameters step k started from,
    in a background thread while step k's update runs (trainer/offpolicy.py); its sampler
    log-probs are π_old of the ratio. 0: on-policy, sampled after the previous update."""

    def check(self):
        self._positive("prompts_per_step", "group_size", "max_prompt_len", "max_new_tokens",
                       "max_sampling_rounds")
        self._nonneg("sample_chunk")
        self._require("sample_chunk", self.prompts_per_step % max(self.sample_chunk, 1) == 0,
                      f"must divide config.rollout.prompts_per_step={self.prompts_per_step}")
        self._require("refill", not self.refill
                      or 0 < self.sample_chunk < self.prompts_per_step,
                      "needs 0 < config.rollout.sample_chunk < config.rollout.prompts_per_step "
                      "(its slots are sample_chunk x group_size rows, refilled from the step's "
                      "queue)")
        self._temperature("temperature")
        self._require("top_p", 0 < self.top_p <= 1, "must be in (0, 1]")
        self._nonneg("top_k")
        self._require("off_policy_steps", self.off_policy_steps in (0, 1)
                      and (self.off_policy_steps == 0 or (self.top_k == 0 and self.top_p == 1)),
                      "must be 0 or 1; 1 needs top_k 0 and top_p 1 (the sampler's log-probs "
                      "are then the policy's, π_old of the ratio)")
