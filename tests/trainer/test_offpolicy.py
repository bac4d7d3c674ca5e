"""One-step-off-policy rollouts (`rollout.off_policy_steps=1`, trainer/offpolicy.py): the
batch of step k+1 sampled in a background thread with the parameters step k started from, its
sampler log-probs π_old of the update. On `smoke`: the first step is the on-policy run's, one
device and the (2, 2, 2) mesh agree, a run killed after its step-2 checkpoint (a batch pending
for step 3) resumes bitwise; the pending batch's record round-trips exactly."""

import math

import jax
import numpy as np
import pytest

from ibpo_jax import config, sampling
from ibpo_jax.config_schema import ConfigError
from ibpo_jax.trainer import loop, offpolicy
from tests.trainer.knob_harness import (
    SMOKE_EXACT,
    comparable,
    run_match_mesh_resume,
)

EXACT = (*SMOKE_EXACT, "policy_lag")


def test_off_policy_steps_takes_0_or_1_with_the_samplers_own_log_probs():
    for bad in ({"rollout.off_policy_steps": "2"}, {"rollout.off_policy_steps": "1",
                                                    "rollout.top_p": "0.9"}):
        with pytest.raises(ConfigError, match="config.rollout.off_policy_steps"):
            config.load("configs/ibpo_gspo.py:smoke", list(bad.items()))


def test_a_pending_batch_record_round_trips_exactly():
    rng = np.random.default_rng(0)
    calls = [sampling.SampleOutput(rng.integers(0, 50, (8, 5)).astype(np.int32),
                                   rng.integers(0, 6, 8).astype(np.int32),
                                   rng.standard_normal((8, 5)).astype(np.float32))
             for _ in range(2)]
    calls[1] = calls[1]._replace(entropy=rng.standard_normal(8).astype(np.float32))
    back = offpolicy.decode_outputs(offpolicy.encode_outputs(calls))
    assert len(back) == 2 and back[0].entropy is None  # a field the sampler left out
    for a, b in zip(calls, back):
        for x, y in zip(a, b):
            assert x is y is None or (x.dtype == y.dtype and np.array_equal(x, y))


def test_the_pool_is_scored_by_one_thread_at_a_time():
    import threading
    import time

    inside, most = [0], [0]

    class Pool:
        def score(self, records, responses):
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            inside[0] -= 1
            return len(records)

        name = "pool"

    pool = offpolicy.Serialized(Pool())
    threads = [threading.Thread(target=pool.score, args=([1], ["a"])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and pool.name == "pool" and pool.score([1, 2], ["a", "b"]) == 2


@pytest.mark.usefixtures("one_device")
def test_off_policy_runs_matches_the_mesh_and_resumes_bitwise(smoke_data_dir, tmp_path,
                                                              plain_smoke_rows):
    on = plain_smoke_rows
    ref = run_match_mesh_resume(smoke_data_dir, tmp_path, {"rollout.off_policy_steps": 1},
                                exact=EXACT)
    # The step-2 checkpoint the harness resumed from was written while step 3's batch was pending.
    meta = loop.Checkpointer(tmp_path / "one" / "checkpoints").meta(2)
    assert meta[offpolicy.PENDING_KEY] and meta["data_position"] == 2 * 4
    assert [r["policy_lag"] for r in ref[1:]] == [0, 1, 1, 1]
    assert "policy_lag" not in on[1]  # off_policy_steps 0: today's rows
    # Step 1 is sampled on-policy: the same batch; π_old is the sampler's log-probs instead of
    # the update's own pass, equal up to float rounding.
    (a,), (b,) = comparable([on[1]]), comparable([ref[1]])
    for key in a:
        assert math.isclose(a[key], b[key], rel_tol=1e-3, abs_tol=1e-4), (key, a[key], b[key])
    # Later batches were sampled one step behind, and their ratios are to that policy: the
    # sampler's log-probs differ from the updated policy's by a step's change (on-policy: by
    # float rounding), and some ratios leave the clip range.
    for s in (2, 3, 4):
        assert on[s]["logprob_mismatch"] < 1e-5 < 100 * on[s]["logprob_mismatch"] \
            < ref[s]["logprob_mismatch"], s
    assert on[1]["clip_frac"] == 0 == sum(r["clip_frac"] for r in on[2:]) \
        < sum(r["clip_frac"] for r in ref[2:])
    # Every trajectory counted once, when its step consumed it.
    assert [r["budget_trajectories"] for r in ref[1:]] == [16, 32, 48, 64]
    for r in ref[2:]:  # the phases and the step's wall time are logged
        assert r["time_step_s"] > 0 and r["time_update_s"] > 0 and r["time_rollout_s"] > 0
    assert jax.device_count() == 8


def test_off_policy_update_takes_the_samplers_log_probs_as_pi_old():
    """Off-policy, the ratio is π_θ / π_sampler: with sampler log-probs 0 it is π_θ of each
    token (in (0, 1]), and halving the sampler's probabilities doubles it; on-policy it is 1
    whatever the sampler reported."""
    from tests.trainer.test_step import GROUP0, GROUP1, REWARDS0, REWARDS1, _rollout, _spec, _update

    rollout = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1])
    half = rollout._replace(sample_logp=rollout.sample_logp + np.log(0.5))
    for algo in ("ibpo_gspo",):  # sequence ratios: exp(mean_t log r_t), doubled too
        cfg, spec = _spec(algo)
        on = _update(cfg, spec, rollout)[1]
        assert float(on["ratio_mean"]) == pytest.approx(1.0, abs=1e-6)
        cfg, spec = _spec(algo, **{"rollout.off_policy_steps": 1})
        off, off_half = _update(cfg, spec, rollout)[1], _update(cfg, spec, half)[1]
        assert 0 < float(off["ratio_min"]) <= float(off["ratio_max"]) <= 1, algo
        assert float(off["ratio_mean"]) < 0.5
        assert float(off_half["ratio_mean"]) == pytest.approx(2 * float(off["ratio_mean"]),
                                                              rel=1e-5), algo
        # The diagnostics still compare the sampler with the policy being updated.
        assert float(off["logprob_mismatch"]) == pytest.approx(float(on["logprob_mismatch"]),
                                                               rel=1e-5)
