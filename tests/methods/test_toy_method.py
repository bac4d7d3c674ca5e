"""A new method is one module and a registry entry: a toy reward-shaping method, defined here
and registered in registry.METHODS for one test, runs in a smoke training run at the same
fixed point of the RL step as PRM+GSPO's process reward; its metric is logged and the rewards
the credit sees moved by its bonus."""

import dataclasses

import jax.numpy as jnp
import pytest

from ibpo_jax import config
from ibpo_jax.config.registry import METHODS
from ibpo_jax.trainer import loop
from ibpo_jax.trainer.hooks import Method, Scored

BONUS = 0.25


class EndedBonus(Method):
    """r̃ = R + BONUS · [the response ended with an EOS] (a `RewardShaper`)."""

    switch = "(registered by tests/methods/test_toy_method.py)"

    @classmethod
    def enabled(cls, cfg) -> bool:
        return True  # every run, while the test keeps it registered

    def shape(self, batch: Scored) -> tuple[Scored, dict[str, float]]:
        ended = batch.rollout.ended.astype(jnp.float32)
        rollout = batch.rollout._replace(reward=batch.rollout.reward + BONUS * ended)
        return dataclasses.replace(batch, rollout=rollout), {
            "toy_bonus_mean": float(BONUS * jnp.mean(ended))}


def _cfg(data_dir):
    return config.load("configs/gspo.py:smoke", [("task.data_dir", str(data_dir)),
                                                  ("train.steps", "2")])


def test_a_toy_reward_shaper_plugs_into_the_rl_step(smoke_data_dir, tmp_path, monkeypatch):
    plain = loop.run(_cfg(smoke_data_dir), workdir=tmp_path / "plain")
    METHODS.names()  # the real entries first (the registry imports them on first use)
    monkeypatch.setitem(METHODS._entries, "toy_bonus", EndedBonus)
    cfg = _cfg(smoke_data_dir)
    assert cfg.methods == ("toy_bonus",)
    toy = loop.run(cfg, workdir=tmp_path / "toy")

    assert [r["step"] for r in toy] == [r["step"] for r in plain] == [0, 1, 2]
    first, toy_first = plain[1], toy[1]
    assert "toy_bonus_mean" not in first and 0 < toy_first["toy_bonus_mean"] <= BONUS
    # Step 1 samples the same responses (same policy, same keys): only the rewards moved,
    # by the bonus of the rows that ended, before the credit computed its statistics.
    assert toy_first["accuracy"] == first["accuracy"]
    assert toy_first["response_len_mean"] == first["response_len_mean"]
    assert toy_first["reward_mean"] == pytest.approx(
        first["reward_mean"] + toy_first["toy_bonus_mean"], abs=1e-6)
    assert toy_first["budget_trajectories"] == first["budget_trajectories"]
