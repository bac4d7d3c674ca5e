"""docs/extending.md's extension points, exercised as a user would: a comparison operator, a
policy loss, an advantage estimator and a procedural task defined in this module (not the
package), registered for one test, selected by their config keys and run in one `smoke` training
step each. (A toy method: tests/methods/test_toy_method.py.)"""

import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import config
from ibpo_jax.config.registry import ESTIMATORS, LOSSES, OPERATORS, UnknownNameError
from ibpo_jax.core import comparison, losses
from ibpo_jax.trainer import loop

HALF = 0.5


def phi_half(units, n_units, correct, *, alignment="lcs", reduce="max"):
    """φ = HALF for every non-empty wrong response of a group with a correct one; Δ = HALF on
    its units (mean HALF), first error at unit 0, no best match."""
    del alignment, reduce
    g, slots = units.shape
    wrong = ~correct & (n_units > 0) & jnp.any(correct)
    phi = jnp.where(wrong, HALF, 0.0).astype(jnp.float32)
    inside = jnp.arange(slots)[None, :] < n_units[:, None]
    return comparison.Phi(phi=phi, delta=jnp.where(inside, phi[:, None], 0.0),
                          first_error=jnp.where(correct, n_units, 0).astype(jnp.int32),
                          best_match=jnp.full((g,), -1, jnp.int32))


CALLS = []


def doubled_gspo(spec, **arrays):
    """GSPO's loss with its numerator doubled (same direction, twice the step)."""
    CALLS.append(spec.name)
    out = losses.gspo_loss(spec, **arrays)
    return out._replace(num=2.0 * out.num)


def sign_advantages(rewards, phi, *, lam, normalize_std=True, eps=1e-6, ddof=0, valid=None):
    """A group estimator: the sign of the shaped reward's deviation from the group mean."""
    del normalize_std, eps, ddof
    CALLS.append("sign")
    shaped = rewards + lam * phi
    w = jnp.ones_like(shaped) if valid is None else valid.astype(shaped.dtype)
    mean = jnp.sum(shaped * w, -1, keepdims=True) / jnp.maximum(jnp.sum(w, -1, keepdims=True), 1)
    return jnp.sign(shaped - mean) * w


def _register(request, registry, name, obj):
    """`@registry.register(name)` as a user's module does it, taken off after the test."""
    registry.register(name)(obj)
    request.addfinalizer(lambda: registry._entries.pop(name, None))


def _one_step(data_dir, workdir, **overrides):
    cfg = config.load("configs/ibpo_gspo.py:smoke", [
        ("task.data_dir", str(data_dir)), ("train.steps", "1"),
        *((k, str(v)) for k, v in overrides.items())])
    return loop.run(cfg, workdir=workdir)


def test_an_operator_from_outside_the_package_credits_a_training_step(smoke_data_dir, tmp_path,
                                                                     request):
    _register(request, OPERATORS, "toy_half", phi_half)
    step = _one_step(smoke_data_dir, tmp_path, **{"ibpo.operator": "toy_half"})[-1]
    # φ is HALF on the wrong responses of mixed groups and 0 on the right ones.
    assert step["step"] == 1 and 0 < step["phi_mean"] <= HALF and step["cov_y_phi"] < 0
    OPERATORS._entries.pop("toy_half")
    with pytest.raises(UnknownNameError, match="toy_half"):  # unknown once it is gone
        _one_step(smoke_data_dir, tmp_path / "again", **{"ibpo.operator": "toy_half"})


def test_a_loss_from_outside_the_package_trains_a_step(smoke_data_dir, tmp_path, request):
    CALLS.clear()
    _register(request, LOSSES, "doubled_gspo", doubled_gspo)
    rows = _one_step(smoke_data_dir, tmp_path, **{"loss.name": "doubled_gspo",
                                                   "loss.clip_eps_low": 3e-4,
                                                   "loss.clip_eps_high": 4e-4})
    assert rows[-1]["step"] == 1 and np.isfinite(rows[-1]["grad_norm"])
    assert CALLS and set(CALLS) == {"doubled_gspo"}  # the step traced this loss


def test_an_estimator_from_outside_the_package_gives_a_steps_advantages(smoke_data_dir, tmp_path,
                                                                        request):
    CALLS.clear()
    _register(request, ESTIMATORS, "sign", sign_advantages)
    rows = _one_step(smoke_data_dir, tmp_path, **{"advantage.estimator": "sign"})
    assert rows[-1]["step"] == 1 and np.isfinite(rows[-1]["grad_norm"])
    assert CALLS and set(CALLS) == {"sign"}  # the step traced this estimator
    # A wrong response of a mixed group sits below its group's mean: advantage -1 on each of
    # its tokens, before and after its first error (grpo's here: -1.73 and -0.88).
    sides = {rows[-1]["adv_mean_before_error"], rows[-1]["adv_mean_after_error"]}
    assert -1.0 in sides and sides <= {-1.0, 0.0}, sides
    # A group estimator takes no per-token credit: the config says so before anything runs.
    with pytest.raises(config.ConfigError, match="takes group inputs.*token"):
        _one_step(smoke_data_dir, tmp_path / "token", **{"advantage.estimator": "sign",
                                                         "ibpo.credit": "token"})


def test_a_procedural_task_from_outside_the_package_trains_a_step(smoke_data_dir, tmp_path,
                                                                   request):
    """One module (tests/toy_task.py) registers one record; the run builds its dataset, reads
    it with the char tokenizer, scores it with its checker (reward workers import the module),
    and the checker's first wrong steps reach `ibpo.operator=checker`."""
    from tests import toy_task

    toy_task.register()
    request.addfinalizer(toy_task.unregister)
    rows = _one_step(smoke_data_dir, tmp_path, **{
        "task.name": "toy_add", "task.data_dir": str(tmp_path / "data"),
        "ibpo.operator": "checker", "warm_start.enabled": False})
    step = rows[-1]
    assert step["step"] == 1 and np.isfinite(step["grad_norm"])
    assert -1.0 <= step["reward_mean"] <= 1.0 and "eval_accuracy" in rows[0]
    built = list((tmp_path / "data").rglob("ibpo_toy_add-train.array_record*"))
    assert built, "the task's dataset was built where the run's data lives"
    toy_task.unregister()
    with pytest.raises(UnknownNameError, match="toy_add"):  # gone with its record
        _one_step(smoke_data_dir, tmp_path / "again", **{"task.name": "toy_add"})
