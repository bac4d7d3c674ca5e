"""The rollout knobs of issue 45 end to end on the `smoke` preset (IBPO-GSPO): dynamic sampling
with DAPO's soft overlong penalty, run on one device, then on a (2, 2, 2) mesh of 8 fake CPU
devices (same metrics up to float rounding), then killed after its step-2 checkpoint and
resumed (the same metrics, bitwise: the extra rounds' keys and the data position)."""

import shutil

import pytest

from ibpo_jax import config
from ibpo_jax.trainer import loop
from ibpo_jax.trainer.logs import read_metrics
from tests.methods.test_methods import _assert_close, _comparable, one_device  # noqa: F401

KNOBS = {"rollout.dynamic_sampling": True, "rollout.max_sampling_rounds": 2,
         "reward.overlong": "soft", "reward.overlong_buffer": 16}
COUNTS = ("groups_filtered", "sampling_rounds", "trajectories_sampled", "groups_mixed")
EXACT = ("accuracy", "eval_accuracy", "response_len_mean", "budget_trajectories", *COUNTS)


def _cfg(data_dir, **extra):
    items = {"task.data_dir": data_dir, "train.steps": 4, **KNOBS, **extra}
    return config.load("configs/ibpo_gspo.py:smoke", [(k, str(v)) for k, v in items.items()])


def test_dynamic_sampling_and_soft_overlong_match_the_mesh_and_resume_bitwise(
        smoke_data_dir, tmp_path, one_device):  # noqa: F811
    ref = loop.run(_cfg(smoke_data_dir, **{"mesh.data": 1}), workdir=tmp_path / "one")
    assert [r["step"] for r in ref] == [0, 1, 2, 3, 4]
    b, g = 4, 4
    for prev, row in zip(ref, ref[1:]):
        rounds = row["sampling_rounds"]
        assert 1 <= rounds <= 2 and row["trajectories_sampled"] == rounds * b * g
        # Every sampled trajectory is in the budget, the dropped groups' included.
        assert row["budget_trajectories"] - prev["budget_trajectories"] == rounds * b * g
        assert row["groups_mixed"] == min(b, rounds * b - row["groups_filtered"])
        # One more round only when the first fell short of B mixed groups.
        assert (rounds == 2) == (row["groups_filtered"] > 0)
        assert -1.0 <= row["overlong_penalty_mean"] <= 0.0
        assert 0.0 <= row["frac_truncated"] <= 1.0
    assert any(r["sampling_rounds"] == 2 for r in ref[1:])  # the smoke base: ~half all-same
    # The trained groups are mixed: none of them all-same unless filled in short.
    for row in ref[1:]:
        assert row["frac_groups_all_same"] == pytest.approx(1 - row["groups_mixed"] / b)

    mesh = loop.run(_cfg(smoke_data_dir, **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2}),
                    workdir=tmp_path / "mesh")
    _assert_close(mesh, ref, EXACT + ("reward_mean",))

    # Killed after the step-2 checkpoint: its later checkpoint and export are gone.
    shutil.copytree(tmp_path / "one", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "4")
    shutil.rmtree(tmp_path / "resumed" / "hf_final")
    loop.run(_cfg(smoke_data_dir, **{"mesh.data": 1}), workdir=tmp_path / "resumed")
    resumed = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    assert _comparable(resumed) == _comparable(ref)
