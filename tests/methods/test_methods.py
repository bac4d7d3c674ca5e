"""End-to-end runs of the methods that add a stage to the RL step (ibpo_jax/methods/, DESIGN
§6-§7): correction rollouts, PRM+GSPO and SCoRe+GRPO on the `smoke` preset, each run on one
device, then on a (2, 2, 2) mesh of 8 fake CPU devices and in two processes of 2 devices each
(same metrics up to float rounding), then killed after its step-2 checkpoint and resumed (the
same metrics, bitwise)."""

import math
import shutil

import jax
import pytest

from ibpo_jax import config, sharding
from ibpo_jax.trainer import loop
from ibpo_jax.trainer.logs import read_metrics
from tests.trainer.multiprocess import train_in_two_processes

# Timings, and the packed share of token positions (the packing rounds to the mesh's size).
TIMING = ("time_", "tokens_per_s", "update_tokens_frac")
EXACT = ("accuracy", "eval_accuracy", "response_len_mean", "corrections",
         "corrections_accuracy", "attempt1_accuracy", "attempt2_accuracy", "budget_trajectories")
METHODS = {
    "corrections": ("ibpo_gspo", {"ibpo.correction_rollouts": True}),
    "prm_gspo": ("prm_gspo", {}),
    "score_grpo": ("score_grpo", {}),
}


@pytest.fixture(scope="module")
def data_dir(smoke_data_dir):
    return smoke_data_dir


def _cfg(method, data_dir, **extra):
    algo, overrides = METHODS[method]
    items = {"task.data_dir": data_dir, "train.steps": 4, **overrides, **extra}
    return config.load(f"configs/{algo}.py:smoke", [(k, str(v)) for k, v in items.items()])


def _comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


@pytest.fixture
def one_device(monkeypatch):
    """make_mesh over the first data*fsdp*tensor devices of the test process's 8."""
    real = sharding.make_mesh

    def make_mesh(*, data=1, fsdp=1, tensor=1, devices=None):
        return real(data=data, fsdp=fsdp, tensor=tensor,
                    devices=devices or jax.devices()[:data * fsdp * tensor])

    monkeypatch.setattr(sharding, "make_mesh", make_mesh)


# Fractions of a float score over a threshold (the PRM's prob > 0.5 per step prefix): a score
# within float rounding of 0.5 may land on the other side on the mesh (seen on one host: one of
# the batch's ~64 step labels, 0.016), so they compare to a few labels, not to rounding.
THRESHOLDED = {"prm_label_accuracy": 0.05}
# The policy-gradient term of centered advantages is a sum that cancels to ~0; what is left is
# rounding that the layout changes (seen: 6e-5 on the mesh, 1.2e-4 in two processes, where one
# device gives 2e-8), so it compares in absolute terms.
NEAR_ZERO = {"pg_loss": 5e-4}
ABS_TOL = {**THRESHOLDED, **NEAR_ZERO}


def _assert_close(rows, reference, exact):
    assert [r["step"] for r in rows] == [r["step"] for r in reference]
    for a, b in zip(_comparable(reference), _comparable(rows)):
        assert a.keys() == b.keys()
        for key in a:
            if key in ABS_TOL:
                assert abs(a[key] - b[key]) <= ABS_TOL[key], (a["step"], key, a[key], b[key])
            elif key in exact:
                assert a[key] == b[key] or (a[key] != a[key] and b[key] != b[key]), (
                    a["step"], key)
            else:
                assert math.isclose(a[key], b[key], rel_tol=1e-3, abs_tol=1e-4), (
                    a["step"], key, a[key], b[key])


@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_runs_matches_the_mesh_and_resumes_bitwise(method, data_dir, tmp_path,
                                                          one_device):
    ref = loop.run(_cfg(method, data_dir, **{"mesh.data": 1}), workdir=tmp_path / "one")
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
        one = loop.run(_cfg(method, data_dir, **{"mesh.data": 1}, **mesh_cfg),
                       workdir=tmp_path / "one_stage2")
    else:
        one = ref
    mesh = loop.run(_cfg(method, data_dir, **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2},
                         **mesh_cfg), workdir=tmp_path / "mesh")
    # Discrete values agree exactly; PRM+GSPO's rewards carry the PRM's float scores.
    exact = EXACT + (() if method == "prm_gspo" else ("reward_mean",))
    _assert_close(mesh, one, exact)

    # Two processes (2 CPU devices each, a data mesh over the 4), the first 2 steps: each
    # scores its share of the rows every process holds (second rounds, the PRM's Monte-Carlo
    # labels, evaluation at steps 0 and 2).
    algo, overrides = METHODS[method]
    items = {"task.data_dir": data_dir, "train.steps": 2, **overrides, **mesh_cfg,
             "mesh.data": -1}
    train_in_two_processes([f"--config=configs/{algo}.py:smoke",
                            f"--workdir={tmp_path / 'two'}",
                            *(f"--config.{k}={v}" for k, v in items.items())])
    _assert_close(read_metrics(tmp_path / "two" / "metrics.jsonl"), one[:3], exact)

    # Killed after the step-2 checkpoint: its later checkpoint and export are gone.
    shutil.copytree(tmp_path / "one", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "4")
    shutil.rmtree(tmp_path / "resumed" / "hf_final")
    loop.run(_cfg(method, data_dir, **{"mesh.data": 1}), workdir=tmp_path / "resumed")
    resumed = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    assert _comparable(resumed) == _comparable(ref)
