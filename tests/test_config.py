"""Config loading: presets, overrides, and one clear error per bad key or value."""

import subprocess
import sys
from pathlib import Path

import pytest

from ibpo_jax import config

CONFIGS = sorted(str(p) for p in Path(__file__).parents[1].glob("configs/*.py")
                 if p.stem not in ("__init__", "base"))


def test_every_config_has_all_presets_and_matches_its_algorithm():
    assert len(CONFIGS) == 6
    for path in CONFIGS:
        algo = Path(path).stem
        for preset in ("arith_tiny", "smoke", "qwen3_32b_math", "qwen3_0.6b_math"):
            c = config.load(f"{path}:{preset}")
            assert c.algo == algo and c.preset == preset
            assert (c.ibpo.operator == "terminal") == (not algo.startswith("ibpo_"))
            assert c.loss.name == algo.removeprefix("ibpo_")


def test_default_preset_is_arith_tiny_and_paper_preset_has_paper_hyperparameters():
    c = config.load("configs/ibpo_gspo.py")
    assert c.preset == "arith_tiny" and c.task.name == "arith" and c.warm_start.enabled
    p = config.load("configs/ibpo_gspo.py:qwen3_32b_math")
    # Paper §4.1: lr 1e-6, β 0.01, G 8, λ 0.5, 400 steps.
    assert (p.optim.lr, p.loss.beta, p.rollout.group_size, p.ibpo.lam, p.train.steps) == (
        1e-6, 0.01, 8, 0.5, 400)
    assert p.model.preset == "qwen3-32b" and p.train.distributed


def test_overrides_are_typed():
    c = config.load("configs/grpo.py:smoke", [("optim.lr", "3e-4"), ("train.steps", "7"),
                                              ("ibpo.credit", "token"), ("train.progress", "true")])
    assert c.optim.lr == 3e-4 and c.train.steps == 7 and c.ibpo.credit == "token"
    assert c.train.progress is True


@pytest.mark.parametrize(
    "overrides, match",
    [
        ([("optim.lrr", "1")], r"config.optim.lrr.*valid keys here:.*\blr\b"),
        ([("optimizer.lr", "1")], r"no section 'optimizer'.*valid:.*optim"),
        ([("train.steps", "many")], r"config.train.steps='many': expected int"),
        ([("train.steps", "0")], r"config.train.steps=0 must be > 0"),
        ([("loss.name", "gpso")], r"unknown policy loss 'gpso' \(config key config.loss.name\)"
                                  r"; valid: .*gspo"),
        ([("ibpo.operator", "lcs2")], r"unknown comparison operator 'lcs2'.*lcs_first_error"),
        ([("ibpo.granularity", "word")], r"config.ibpo.granularity='word'; valid: step, token"),
        ([("optim.microbatches", "3")], r"must divide"),
        ([("rollout.top_p", "1.5")], r"config.rollout.top_p=1.5 must be in \(0, 1\]"),
    ],
)
def test_bad_keys_and_values_name_the_key(overrides, match):
    with pytest.raises((config.ConfigError, KeyError), match=match):
        config.load("configs/ibpo_gspo.py:smoke", overrides)


def test_bad_files_and_presets(tmp_path):
    with pytest.raises(config.ConfigError, match="no config file"):
        config.load("configs/nope.py")
    with pytest.raises(config.ConfigError, match=r"unknown preset 'huge'; valid: arith_tiny"):
        config.load("configs/gspo.py:huge")
    bad = tmp_path / "bad.py"
    bad.write_text("def get_config(arg=None):\n    return {'seed': 0}\n")
    with pytest.raises(config.ConfigError):
        config.load(str(bad))


def test_round_trip_through_dict():
    c = config.load("configs/ibpo_ppo.py:smoke")
    assert config.from_dict(c.to_dict()) == c


def test_modules_below_the_trainer_do_not_import_ml_collections():
    code = ("import sys; import ibpo_jax.trainer.loop, ibpo_jax.trainer.step, ibpo_jax.config; "
            "assert 'ml_collections' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
