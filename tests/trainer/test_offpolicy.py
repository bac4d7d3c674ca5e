"""One-step-off-policy rollouts (`rollout.off_policy_steps=1`, trainer/offpolicy.py): the
batch of step k+1 sampled in a background thread with the parameters step k started from, its
sampler log-probs π_old of the update. On `smoke`: the first step is the on-policy run's, one
device and the (2, 2, 2) mesh agree, a run killed after its step-2 checkpoint (a batch pending
for step 3) resumes bitwise; the pending batch's arrays round-trip exactly, in an .npz beside the
checkpoint's JSON record, committed with it."""

import base64
import io
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import config
from ibpo_jax.config.schema import ConfigError
from ibpo_jax.data.sampler import IndexSampler
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import sampling
from ibpo_jax.trainer import checkpoint, loop, offpolicy
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


def _calls() -> list[sampling.SampleOutput]:
    """Two sampler calls' host arrays; the second also reports entropy."""
    rng = np.random.default_rng(0)
    calls = [sampling.SampleOutput(rng.integers(0, 50, (8, 5)).astype(np.int32),
                                   rng.integers(0, 6, 8).astype(np.int32),
                                   rng.standard_normal((8, 5)).astype(np.float32))
             for _ in range(2)]
    calls[1] = calls[1]._replace(entropy=rng.standard_normal(8).astype(np.float32))
    return calls


def _assert_same_calls(back: list[sampling.SampleOutput], calls: list[sampling.SampleOutput]):
    assert len(back) == 2 and back[0].entropy is None  # a field the sampler left out
    for a, b in zip(calls, back):
        for x, y in zip(a, b):
            assert x is y is None or (x.dtype == y.dtype and x.tobytes() == y.tobytes())


def _checkpointer_saving(tmp_path, arrays):
    """A Checkpointer (keep 1) of tmp_path/ckpt whose step 1 holds `arrays`, and the record
    and arrays it was given."""
    ckpt = checkpoint.Checkpointer(tmp_path / "ckpt", keep=1)
    meta = {"step": 1}
    ckpt.save(1, {"w": np.arange(3.0)}, meta, arrays=arrays)
    return ckpt, meta


def test_a_pending_batch_round_trips_exactly_in_a_file_the_record_names(tmp_path):
    calls = _calls()
    ckpt, meta = _checkpointer_saving(tmp_path, offpolicy.pack_outputs(calls))
    assert (ckpt.path(1) / checkpoint.ARRAYS_FILE).is_file()
    assert ckpt.meta(1) == {**meta, checkpoint.ARRAYS: checkpoint.ARRAYS_FILE}  # names the file
    _assert_same_calls(offpolicy.unpack_outputs(
        checkpoint.Checkpointer(tmp_path / "ckpt").arrays(1)), calls)


def test_a_resume_reads_the_arrays_once(tmp_path, monkeypatch):
    """`restore_latest` reads the arrays to judge the step intact; the resumed run's
    `arrays(step)` gets that read, not a second one (a later step's arrays are read anew)."""
    calls = _calls()
    _checkpointer_saving(tmp_path, offpolicy.pack_outputs(calls))
    reads = []
    real = checkpoint.NpzHandler.restore
    monkeypatch.setattr(checkpoint.NpzHandler, "restore",
                        lambda self, *a, **k: reads.append(1) or real(self, *a, **k))
    again = checkpoint.Checkpointer(tmp_path / "ckpt", keep=2)
    step, _, meta = again.restore_latest({"w": jnp.zeros(3)}, log=print)
    assert step == 1 and meta[checkpoint.ARRAYS] and len(reads) == 1
    _assert_same_calls(offpolicy.unpack_outputs(again.arrays(1)), calls)
    assert len(reads) == 1
    again.arrays(1)  # handed over once: a second call reads the file
    assert len(reads) == 2


def _rollouts(off_policy_steps: int) -> offpolicy.Schedule:
    """The schedule on one device given only what it uses; nothing here samples or collects."""
    cfg = config.load("configs/ibpo_gspo.py:smoke",
                      [("rollout.off_policy_steps", str(off_policy_steps))])
    mesh = sharding.make_mesh(devices=jax.devices()[:1])

    def never(*_, **__):
        raise AssertionError("a replay neither samples nor collects")

    placement = offpolicy.Placement(cfg.rollout, meshes=(mesh, mesh), dtype=jnp.float32,
                                    sampler=never)
    return offpolicy.schedule(cfg.rollout, placement, IndexSampler(8, seed=0))


def test_a_resumed_run_replays_the_pending_batch_of_each_record_format():
    """The record names the checkpoint's arrays (read by `arrays`; earlier records also named
    the file under the legacy key), or, written before the file, holds the .npz in base64:
    each way the next sampler calls are the saved ones."""
    calls = _calls()
    packed = offpolicy.pack_outputs(calls)
    buf = io.BytesIO()
    np.savez_compressed(buf, **packed)
    legacy = base64.b64encode(buf.getvalue()).decode("ascii")
    named = {checkpoint.ARRAYS: checkpoint.ARRAYS_FILE}
    for record, arrays in ((named, lambda: packed),
                           ({**named, offpolicy.LEGACY_PENDING_KEY: checkpoint.ARRAYS_FILE},
                            lambda: packed),
                           ({offpolicy.LEGACY_PENDING_KEY: legacy},
                            lambda: pytest.fail("a legacy record reads no file"))):
        r = _rollouts(1)
        assert r.saved({"step": 2}) == ({"step": 2}, None)  # nothing pending: the record alone
        r.restored({"step": 2, **record}, arrays)
        _assert_same_calls([_host(r.placement.generate(None, None, None)) for _ in calls],
                           calls)
    r = _rollouts(1)  # no arrays named: nothing pending, nothing replayed
    r.restored({"step": 2}, lambda: pytest.fail("no arrays named"))
    assert r.placement.replay == []
    r = _rollouts(0)  # on-policy: named arrays mean nothing, no file is read
    r.restored(named, lambda: pytest.fail("read on-policy"))
    with pytest.raises(AssertionError, match="neither samples"):
        r.placement.generate(None, _Prompts(), None)


class _Prompts:
    lengths = np.zeros(4, np.int32)
    tokens = np.zeros((4, 2), np.int32)


def _host(out: sampling.SampleOutput) -> sampling.SampleOutput:
    return sampling.SampleOutput(*(None if x is None else np.asarray(x) for x in out))


def test_a_run_killed_mid_save_resumes_from_the_previous_checkpoint_whole(tmp_path,
                                                                          monkeypatch):
    """The arrays and the record are items of one orbax step directory, committed (renamed
    from its temporary name) after both are written: a run killed after the .npz and before
    the JSON, or the commit, leaves the previous step the latest, record and arrays intact."""
    calls = _calls()
    ckpt, meta = _checkpointer_saving(tmp_path, offpolicy.pack_outputs(calls))
    written = []

    def killed(self, directory, args):  # the .npz written, then the run dies
        real_save(self, directory, args)
        written.append(sorted(p.name for p in directory.iterdir()))
        raise KeyboardInterrupt("killed")

    real_save = checkpoint.NpzHandler.save
    monkeypatch.setattr(checkpoint.NpzHandler, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(2, {"w": np.arange(3.0) + 1}, {**meta, "step": 2},
                  arrays=offpolicy.pack_outputs(calls[::-1]))
    assert written == [["arrays.npz"]]
    monkeypatch.undo()
    again = checkpoint.Checkpointer(tmp_path / "ckpt", keep=1)  # the restarted run's
    assert again.all_steps() == [1] and again.latest_meta() == (
        1, {**meta, checkpoint.ARRAYS: checkpoint.ARRAYS_FILE})
    _assert_same_calls(offpolicy.unpack_outputs(again.arrays(1)), calls)


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
    ckpt = loop.Checkpointer(tmp_path / "one" / "checkpoints")
    meta = ckpt.meta(2)
    assert meta["data_position"] == 2 * 4
    # The record names the batch's file once (its 4 x G 4 rows sampled in one call) and holds
    # none of its arrays.
    assert meta[checkpoint.ARRAYS] == checkpoint.ARRAYS_FILE
    assert offpolicy.LEGACY_PENDING_KEY not in meta
    assert not any(isinstance(v, str) and len(v) > 100 for v in meta.values())
    assert [len(ckpt.arrays(2)[f"{k}_0"]) for k in ("tokens", "lengths", "logprobs")] == [16] * 3
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
