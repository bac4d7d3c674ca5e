"""methods.prm.method._truth: the checker's first wrong steps, decided by all processes
together, so that a process whose share of rows is empty still joins the collectives that
follow (it used to skip them and leave the others waiting)."""

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
from ibpo_jax import sharding
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
