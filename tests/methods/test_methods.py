"""End-to-end runs of the methods that add a stage to the RL step (ibpo_jax/methods/, DESIGN
§6-§7): correction rollouts, PRM+GSPO and SCoRe+GRPO on the `smoke` preset, each run on one
device, then on a (2, 2, 2) mesh of 8 fake CPU devices and in two processes of 2 devices each
(same metrics up to float rounding), then killed after its step-2 checkpoint and resumed (the
same metrics, bitwise)."""

import pytest

from ibpo_jax.trainer import loop
from ibpo_jax.trainer.logs import read_metrics
from tests.trainer.knob_harness import (
    EXACT,
    MESH,
    ONE,
    assert_close,
    assert_resumes_bitwise,
    smoke_cfg,
)
from tests.trainer.multiprocess import train_in_two_processes

METHODS = {
    "corrections": ("ibpo_gspo", {"ibpo.correction_rollouts": True}),
    "prm_gspo": ("prm_gspo", {}),
    "score_grpo": ("score_grpo", {}),
}


def _cfg(method, data_dir, **extra):
    algo, overrides = METHODS[method]
    return smoke_cfg(data_dir, {**overrides, **extra}, algo=algo)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_runs_matches_the_mesh_and_resumes_bitwise(method, smoke_data_dir, tmp_path,
                                                          one_device):
    ref = loop.run(_cfg(method, smoke_data_dir, **ONE), workdir=tmp_path / "one")
    assert [r["step"] for r in ref] == [0, 1, 2, 3, 4]
    per_step = 16 * (2 if method == "score_grpo" else 1)
    for prev, row in zip(ref[1:], ref[2:]):
        assert row["budget_trajectories"] - prev["budget_trajectories"] >= per_step
    if method == "corrections":
        fixes = sum(r["corrections"] for r in ref[1:])
        assert fixes > 0  # the smoke base gets wrong responses in groups with a right one
        assert ref[-1]["budget_trajectories"] == pytest.approx(64 + 1.2 * fixes)
        assert all(0 < r["corrections_token_share"] < 1 for r in ref[1:] if r["corrections"])
    if method == "prm_gspo":
        fit = ref[0]
        assert ref[0]["budget_trajectories"] == fit["prm_label_cost"] > 0
        assert fit["prm_fit_loss"] < fit["prm_fit_loss_init"]
        for r in ref[1:]:
            assert 0 <= r["prm_mean"] <= 1 and 0 <= r["prm_label_accuracy"] <= 1
    if method == "score_grpo":
        assert [r["score_stage"] for r in ref[1:]] == [1, 1, 2, 2]  # smoke: 2 stage-I steps
        for r in ref[1:]:
            assert r["flip_wrong_to_right"] <= 1 - r["attempt1_accuracy"]
            assert r["attempt2_accuracy"] == pytest.approx(
                r["attempt1_accuracy"] + r["flip_wrong_to_right"] - r["flip_right_to_wrong"])

    # SCoRe's stage I on the smoke base often has no second attempt right: its gradient is then
    # the KL terms' alone, which are float noise at π = π_ref (exactly 0 on one device, ~1e-6 on
    # the mesh, whose reference pass sums in another order), and Adam scales noise up to a
    # full step. The mesh is compared on stage II from the start, where the signal is real.
    mesh_cfg = {"score.stage1_steps": 0} if method == "score_grpo" else {}
    if mesh_cfg:
        one = loop.run(_cfg(method, smoke_data_dir, **ONE, **mesh_cfg),
                       workdir=tmp_path / "one_stage2")
    else:
        one = ref
    mesh = loop.run(_cfg(method, smoke_data_dir, **MESH, **mesh_cfg), workdir=tmp_path / "mesh")
    # Discrete values agree exactly; PRM+GSPO's rewards carry the PRM's float scores.
    exact = EXACT + (() if method == "prm_gspo" else ("reward_mean",))
    assert_close(mesh, one, exact)

    # Two processes (2 CPU devices each, a data mesh over the 4), the first 2 steps: each
    # scores its share of the rows every process holds (second rounds, the PRM's Monte-Carlo
    # labels, evaluation at steps 0 and 2).
    algo, overrides = METHODS[method]
    items = {"task.data_dir": smoke_data_dir, "train.steps": 2, **overrides, **mesh_cfg,
             "mesh.data": -1}
    train_in_two_processes([f"--config=configs/{algo}.py:smoke",
                            f"--workdir={tmp_path / 'two'}",
                            *(f"--config.{k}={v}" for k, v in items.items())])
    assert_close(read_metrics(tmp_path / "two" / "metrics.jsonl"), one[:3], exact)

    assert_resumes_bitwise(_cfg(method, smoke_data_dir, **ONE), tmp_path, ref)
