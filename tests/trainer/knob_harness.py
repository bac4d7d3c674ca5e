"""The end-to-end harness of the knob and method tests (not collected: no `test_` prefix): a
`smoke` config of 4 steps run in-process on one device, then on a (2, 2, 2) mesh of 8 fake CPU
devices (the same metrics up to float rounding), then killed after its step-2 checkpoint and
resumed (the same metrics, bitwise). The tests use it with the `one_device` fixture
(tests/conftest.py: `use_first_devices`), so that a one-device run takes one of the process's
8 devices; `plain_smoke_rows` there is the plain run's metrics, run once per process."""

import math
import shutil

import jax

from ibpo_jax import config
from ibpo_jax.runtime import sharding
from ibpo_jax.trainer import loop
from ibpo_jax.trainer.logs import read_metrics

# Timings, and the packed share of token positions (the packing rounds to the mesh's size).
TIMING = ("time_", "tokens_per_s", "update_tokens_frac")
# Discrete metrics, equal on any mesh: the methods' (tests/methods), and the plain smoke run's.
EXACT = ("accuracy", "eval_accuracy", "response_len_mean", "corrections",
         "corrections_accuracy", "attempt1_accuracy", "attempt2_accuracy", "budget_trajectories")
SMOKE_EXACT = ("accuracy", "eval_accuracy", "response_len_mean", "budget_trajectories",
               "reward_mean")
ONE = {"mesh.data": 1}
MESH = {"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2}

# Fractions of a float score over a threshold (the PRM's prob > 0.5 per step prefix): a score
# within float rounding of 0.5 may land on the other side on the mesh (seen on one host: one of
# the batch's ~64 step labels, 0.016), so they compare to a few labels, not to rounding.
THRESHOLDED = {"prm_label_accuracy": 0.05}
# The policy-gradient term of centered advantages is a sum that cancels to ~0; what is left is
# rounding that the layout changes (seen: 6e-5 on the mesh, 1.2e-4 in two processes, where one
# device gives 2e-8), so it compares in absolute terms.
NEAR_ZERO = {"pg_loss": 5e-4}
ABS_TOL = {**THRESHOLDED, **NEAR_ZERO}


def use_first_devices(monkeypatch) -> None:
    """make_mesh over the first data*fsdp*tensor devices of the test process's 8 (a one-device
    run on one of them) while `monkeypatch` holds."""
    real = sharding.make_mesh

    def make_mesh(*, data=1, fsdp=1, tensor=1, devices=None):
        return real(data=data, fsdp=fsdp, tensor=tensor,
                    devices=devices or jax.devices()[:data * fsdp * tensor])

    monkeypatch.setattr(sharding, "make_mesh", make_mesh)


def smoke_cfg(data_dir, items: dict, *, algo: str = "ibpo_gspo"):
    """`configs/<algo>.py:smoke` for 4 steps on the data under `data_dir`, with `items`
    ({dotted key: value}) on top."""
    items = {"task.data_dir": data_dir, "train.steps": 4, **items}
    return config.load(f"configs/{algo}.py:smoke", [(k, str(v)) for k, v in items.items()])


def comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def assert_close(rows: list[dict], reference: list[dict], exact: tuple[str, ...]) -> None:
    """Same steps and keys; `exact` keys equal (NaN = NaN), ABS_TOL's within their bound, the
    others to float rounding (rel 1e-3, abs 1e-4)."""
    assert [r["step"] for r in rows] == [r["step"] for r in reference]
    for a, b in zip(comparable(reference), comparable(rows)):
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


def assert_resumes_bitwise(cfg, tmp_path, ref: list[dict]) -> None:
    """The run in tmp_path/one killed after its step-2 checkpoint (its later checkpoint and
    export gone) and resumed with `cfg` logs `ref`'s metrics, bitwise."""
    shutil.copytree(tmp_path / "one", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "4")
    shutil.rmtree(tmp_path / "resumed" / "hf_final")
    loop.run(cfg, workdir=tmp_path / "resumed")
    assert comparable(read_metrics(tmp_path / "resumed" / "metrics.jsonl")) == comparable(ref)


def run_match_mesh_resume(data_dir, tmp_path, knobs: dict, *, exact: tuple[str, ...],
                          algo: str = "ibpo_gspo") -> list[dict]:
    """`smoke` with `knobs` on one device (tmp_path/one, steps 0-4), on the (2, 2, 2) mesh
    (assert_close with `exact`) and killed / resumed (bitwise); returns the one-device rows for
    the test's own checks."""
    ref = loop.run(smoke_cfg(data_dir, {**knobs, **ONE}, algo=algo), workdir=tmp_path / "one")
    assert [r["step"] for r in ref] == [0, 1, 2, 3, 4]
    mesh = loop.run(smoke_cfg(data_dir, {**knobs, **MESH}, algo=algo),
                    workdir=tmp_path / "mesh")
    assert_close(mesh, ref, exact)
    assert_resumes_bitwise(smoke_cfg(data_dir, {**knobs, **ONE}, algo=algo), tmp_path, ref)
    return ref
