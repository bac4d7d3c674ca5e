"""The methods' plug-in interface (trainer/hooks.py, registry.METHODS): the registry, which
config turns which method on, the protocols each implements, and the order `Methods` calls
them in."""

import dataclasses
import types
from typing import NamedTuple

import numpy as np
import pytest

from ibpo_jax import config
from ibpo_jax.config.registry import METHODS, UnknownNameError
from ibpo_jax.trainer import hooks


def test_the_registry_lists_the_three_methods_and_names_them_on_a_typo():
    assert METHODS.names() == ["corrections", "prm", "score"]
    with pytest.raises(UnknownNameError, match="unknown method 'scroe'; valid: corrections, "
                                               "prm, score"):
        METHODS.get("scroe")


@pytest.mark.parametrize("algo, overrides, methods", [
    ("gspo", [], ()), ("ibpo_gspo", [], ()), ("prm_gspo", [], ("prm",)),
    ("score_grpo", [], ("score",)),
    ("ibpo_gspo", [("ibpo.correction_rollouts", "true")], ("corrections",)),
    ("prm_gspo", [("ibpo.correction_rollouts", "true")], ("corrections", "prm")),
])
def test_each_config_turns_on_its_methods(algo, overrides, methods):
    cfg = config.load(f"configs/{algo}.py:smoke", overrides)
    assert cfg.methods == methods
    # A method with an extra round has prompts of its own: the update packs rows.
    assert (cfg.update_layout == "packed") == any(METHODS.get(m).adds_round() for m in methods)


def test_each_method_implements_its_protocols():
    kinds = {name: {p.__name__ for p in (hooks.Preparer, hooks.RewardShaper, hooks.ExtraRound,
                                          hooks.Answerer) if issubclass(METHODS.get(name), p)}
             for name in METHODS.names()}
    assert kinds == {"corrections": {"ExtraRound"}, "prm": {"Preparer", "RewardShaper"},
                     "score": {"ExtraRound", "Answerer"}}
    assert all(issubclass(METHODS.get(n), hooks.Method) for n in METHODS.names())


def test_trajectories_per_step_count_the_fixed_rounds():
    r = config.load("configs/score_grpo.py:smoke").rollout
    assert (r.prompts_per_step, r.group_size) == (4, 4)
    assert config.load("configs/score_grpo.py:smoke").trajectories_per_step == 2 * 16
    assert config.load("configs/prm_gspo.py:smoke").trajectories_per_step == 16
    cfg = config.load("configs/ibpo_gspo.py:smoke", [("ibpo.correction_rollouts", "true")])
    assert cfg.rows_per_step == cfg.trajectories_per_step == 16  # corrections: data-dependent


class _Rows(NamedTuple):  # the part of a Rollout the stubs touch
    reward: np.ndarray


class _Stub(hooks.Method):
    """Records its calls in `log`; its fit costs 2.5 trajectories; it shapes by adding `add`
    to every reward."""

    log: list = []

    def __init__(self, ctx, name, add):
        super().__init__(ctx)
        self.name, self.add = name, add

    def prepare(self, fresh, log):
        self.log.append(("prepare", self.name, fresh))
        return 2.5, {f"{self.name}_fit": 1.0}

    def shape(self, batch):
        self.log.append(("shape", self.name, float(batch.rollout.reward[0])))
        rollout = batch.rollout._replace(reward=batch.rollout.reward + self.add)
        return dataclasses.replace(batch, rollout=rollout), {f"{self.name}_shaped": self.add}


def test_methods_call_each_stage_in_name_order_and_join_what_they_return(monkeypatch):
    entries = {"a_first": lambda ctx: _Stub(ctx, "a", 1.0),
               "b_second": lambda ctx: _Stub(ctx, "b", 10.0)}
    ctx = types.SimpleNamespace(cfg=types.SimpleNamespace(methods=("a_first", "b_second")))
    monkeypatch.setattr(METHODS, "get", lambda name, key=None: entries[name])
    _Stub.log = []
    methods = hooks.Methods(ctx)
    cost, fitted = methods.prepare(False, print)
    assert cost == 5.0 and fitted == {"a_fit": 1.0, "b_fit": 1.0}
    batch = hooks.Scored(1, [{}], _Rows(np.zeros(3)), np.arange(3), [], None)
    shaped, metrics = methods.shape(batch)
    np.testing.assert_array_equal(shaped.rollout.reward, [11.0, 11.0, 11.0])
    assert metrics == {"a_shaped": 1.0, "b_shaped": 10.0}
    # b shapes what a returned, in name order.
    assert _Stub.log == [("prepare", "a", False), ("prepare", "b", False), ("shape", "a", 0.0),
                         ("shape", "b", 1.0)]
    assert methods.extend(batch, None) is None and methods.answer(None) is None
