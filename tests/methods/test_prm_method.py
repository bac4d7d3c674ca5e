"""methods.prm.method._truth: the checker's first wrong steps, decided by all processes
together, so that a process whose share of rows is empty still joins the collectives that
follow (it used to skip them and leave the others waiting); and the step metrics of
PrmReward.shape, over the valid rows."""

import dataclasses

import numpy as np

from ibpo_jax.methods.prm.method import _truth
from tests.trainer.multiprocess import script_in_two_processes


def test_one_process():
    truth = _truth([{"first_wrong_step": None}, {"first_wrong_step": 3}])
    assert truth.tolist() == [-1, 3] and truth.dtype == np.int64
    assert _truth([{"first_wrong_step": 1}, {"correct": True}]) is None  # checker without it
    assert _truth([]) is None  # no row anywhere


_SCRIPT = '''
import json
import jax
from ibpo_jax.runtime import sharding
from ibpo_jax.methods.prm.method import _truth

sharding.initialize_distributed(True)
first = jax.process_index() == 0
out = {}
# One row in all: process 0's share is empty, process 1 holds row 0.
truth = _truth([] if first else [{"first_wrong_step": 2}])
out["share"] = None if truth is None else [truth.tolist(), str(truth.dtype)]
out["whole"] = None if truth is None else sharding.gather_shares(truth, 1).tolist()
# One process's checker lacks the field: neither grades.
truth = _truth([{"first_wrong_step": 1}] if first else [{"correct": False}])
out["lacking"] = None if truth is None else truth.tolist()
print("RESULT " + json.dumps(out))
'''


def test_two_processes_agree_when_one_share_is_empty():
    results = script_in_two_processes(_SCRIPT, timeout=180)
    assert [r["share"] for r in results] == [[[], "int64"], [[2], "int64"]]
    assert [r["whole"] for r in results] == [[2], [2]]
    assert [r["lacking"] for r in results] == [None, None]


def test_step_metrics_leave_dynamic_sampling_fillers_out():
    """PrmReward.shape's prm_mean and prm_label_accuracy describe the valid rows only: rows
    2, 3 are a filler group (`Rollout.valid`). The PRM's scores are given, not computed."""
    import types

    import jax
    import jax.numpy as jnp

    from ibpo_jax.methods.prm.method import PrmReward
    from ibpo_jax.runtime import sharding
    from ibpo_jax.trainer.credit import Rollout
    from ibpo_jax.trainer.hooks import Scored

    prob = jnp.array([[0.9, 0.2], [0.7, 0.0], [0.1, 0.3], [0.0, 0.0]])  # [N = 4, K = 2]
    steps = jnp.array([[True, True], [True, False], [True, True], [False, False]])
    method = PrmReward.__new__(PrmReward)  # the fitted head stands in for the PRM's scores
    method.ctx = types.SimpleNamespace(mesh=sharding.make_mesh(devices=jax.devices()[:1]),
                                       base_params=None, is_delim=None)
    method.cfg, method.head = types.SimpleNamespace(weight=0.5), None
    method.scores = lambda *_: (prob, steps)
    z = jnp.zeros((4, 3), jnp.int32)
    rollout = Rollout(prompt=z, prompt_len=jnp.ones(4, jnp.int32), response=z,
                      response_len=jnp.ones(4, jnp.int32), sample_logp=jnp.zeros((4, 3)),
                      reward=jnp.array([1.0, -1.0, -1.0, -1.0]),
                      correct=jnp.array([True, False, False, False]), ended=jnp.ones(4, bool),
                      valid=jnp.array([True, True, False, False]))
    # First wrong steps: row 0 errs at step 1 (prefix 0 clean, 1 not), rows 1, 2 never.
    infos = [{"first_wrong_step": 1}, {"first_wrong_step": None},
             {"first_wrong_step": None}, {"first_wrong_step": None}]
    batch = Scored(1, [{}, {}], rollout, np.arange(4), infos, None)
    shaped, metrics = method.shape(batch)
    # min over steps: 0.2, 0.7 (valid); 0.1, 0 (filler). All rows: 0.25.
    np.testing.assert_allclose(metrics["prm_mean"], (0.2 + 0.7) / 2, rtol=1e-6)
    # prob > 0.5 vs clean: row 0 2/2, row 1 1/1 (valid); row 2's 0/2 left out. All rows: 3/5.
    assert metrics["prm_label_accuracy"] == 1.0
    np.testing.assert_allclose(shaped.rollout.reward, [1.1, -0.65, -0.95, -1.0], rtol=1e-6)
    # Every row valid (None): the mean over all rows, as before.
    _, plain = method.shape(dataclasses.replace(batch, rollout=rollout._replace(valid=None)))
    np.testing.assert_allclose(plain["prm_mean"], 0.25, rtol=1e-6)
    assert plain["prm_label_accuracy"] == 3 / 5
