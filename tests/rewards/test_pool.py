"""RewardPool: order, parallel == in-process, and hangs / exceptions / dying workers scored as
failures within the timeout while the pool stays usable; sandboxes die with their worker."""

import os
import time

import numpy as np
import pytest

from ibpo_jax.config.registry import REWARDS
from ibpo_jax.data import arith
from ibpo_jax.rewards import Reward, RewardPool, get_reward
from tests.rewards.hostile_rewards import behave

BEHAVE = Reward(name="behave", verifier=behave)
TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def pool():
    with RewardPool(BEHAVE, num_workers=2, timeout_s=TIMEOUT_S) as p:
        yield p


def test_registry_and_unknown_names():
    assert {"arith", "math", "code"} <= set(REWARDS.names())
    with pytest.raises(KeyError, match="unknown reward 'nope'.*valid: arith"):
        get_reward("nope")


def test_scores_come_back_in_order(pool):
    answers = ["a", "b", "c", "d", "e"]
    responses = ["a", "x", "c", "x", "e"]
    rewards, infos = pool.score([{"answer": a} for a in answers], responses)
    assert rewards.dtype == np.float32
    assert rewards.tolist() == [1.0, -1.0, 1.0, -1.0, 1.0]
    assert [info["answer"] for info in infos] == responses
    assert pool.score([], [])[0].shape == (0,)


def test_hang_raise_and_crash_are_failures_and_the_pool_survives(pool):
    records = [{"answer": "ok"}] * 4
    start = time.monotonic()
    rewards, infos = pool.score(records, ["ok", "hang", "raise", "crash"])
    elapsed = time.monotonic() - start
    assert rewards.tolist() == [1.0, -1.0, -1.0, -1.0]
    assert infos[1]["reason"] == f"reward timed out after {TIMEOUT_S:g} s"
    assert infos[2]["reason"] == "reward 'behave' raised ValueError: kaboom"
    assert infos[3]["reason"].startswith("reward worker died")
    assert elapsed < TIMEOUT_S + 3.0  # one timeout plus slack (worker restarts are async)
    rewards, _ = pool.score([{"answer": "ok"}] * 3, ["ok", "no", "ok"])
    assert rewards.tolist() == [1.0, -1.0, 1.0]


def test_parallel_matches_in_process_for_arith():
    records = arith.generate(arith.ArithConfig(), 3, 6)
    responses = [r["reference"] if i % 2 else f"{r['reference'][:-1]}{r['answer'] % 10 + 1}"
                 for i, r in enumerate(records)]  # even: last digit of the answer changed
    with RewardPool("arith", num_workers=0, timeout_s=1.0) as local:
        local_rewards, local_infos = local.score(records, responses)
    with RewardPool("arith", num_workers=2, timeout_s=5.0, values=(0.0, 1.0)) as remote:
        remote_rewards, remote_infos = remote.score(records, responses)
    assert local_rewards.tolist() == [-1.0, 1.0] * 3
    assert remote_rewards.tolist() == [0.0, 1.0] * 3
    assert [i["first_wrong_step"] for i in remote_infos] == [3, None] * 3
    assert [i["reason"] for i in remote_infos] == [i["reason"] for i in local_infos]


def test_in_process_contains_exceptions_and_bad_calls_raise():
    with RewardPool(BEHAVE, num_workers=0, timeout_s=1.0) as local:
        rewards, infos = local.score([{"answer": "x"}], ["raise"])
        assert rewards.tolist() == [-1.0] and "kaboom" in infos[0]["reason"]
        with pytest.raises(ValueError, match="1 records but 2 responses"):
            local.score([{"answer": "x"}], ["a", "b"])
    with pytest.raises(RuntimeError, match="after close"):
        local.score([], [])
    with pytest.raises(ValueError, match="num_workers"):
        RewardPool(BEHAVE, num_workers=-1, timeout_s=1.0)


def test_a_killed_worker_takes_its_sandbox_with_it():
    code = get_reward("code", timeout_s=60.0)
    record = {"tests": [{"input": "", "output": "1"}]}
    with RewardPool(code, num_workers=1, timeout_s=2.0) as p:
        worker_dir = p._workers[0].tmp_dir
        rewards, infos = p.score([record], ["```python\nimport time\ntime.sleep(600)\n```"])
        assert rewards.tolist() == [-1.0] and "timed out" in infos[0]["reason"]
        time.sleep(0.2)  # PR_SET_PDEATHSIG delivery is immediate; leave a margin
        alive = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{pid}/cwd").startswith(worker_dir):
                    alive.append(pid)
            except OSError:
                continue
        assert alive == []
        assert not os.path.exists(worker_dir)
        assert p.score([record], ["```python\nprint(1)\n```"])[0].tolist() == [1.0]
