"""Partial rollouts (`rollout.partial`, trainer/partial.py): rows carried over steps continue
from their prefix with each token's own log-prob, the step learns the oldest finished groups,
`policy_lag` counts tokens by the step that sampled them, and a run resumes bitwise."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import models
from ibpo_jax.config import ConfigError, load
from ibpo_jax.data.sampler import IndexSampler
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import refill, sampling
from ibpo_jax.trainer import checkpoint, loop, offpolicy, partial
from tests.sampler.test_sampling_compaction import CFG
from tests.trainer.knob_harness import SMOKE_EXACT, run_match_mesh_resume

B, G, K, N, T, P = 2, 3, 4, 16, 4, 6
EOS = tuple(range(100, 112))  # 3/32 of the vocabulary: rows end at scattered rounds


class _Tokenizer:
    """Prompts are space-separated token ids."""

    pad_id, bos_id, eos_ids = 0, None, EOS

    def encode(self, text):
        return [int(x) for x in text.split()]


def _cfg(**rollout):
    r = dict(prompts_per_step=B, group_size=G, partial_prompts=K, max_new_tokens=N,
             partial_tokens=T, max_prompt_len=P, sample_chunk=0, refill=False)
    r.update(rollout)
    return types.SimpleNamespace(rollout=types.SimpleNamespace(
        **r, round_tokens=T, prompts_in_flight=K))


def _collector(mesh):
    rng = np.random.default_rng(5)
    records = [{"q": " ".join(map(str, rng.integers(1, 100, rng.integers(1, P + 3))))}
               for _ in range(40)]  # some longer than P: left-truncated
    return types.SimpleNamespace(
        records=records, order=IndexSampler(len(records), seed=0), tokenizer=_Tokenizer(),
        task=types.SimpleNamespace(prompt_text=lambda r: r["q"]), mesh=mesh)


def _flight(m, mesh, **rollout):
    def make(samples):
        kw = dict(max_new_tokens=T, eos_ids=EOS, num_samples=samples, mesh=mesh)
        if rollout.get("refill"):
            return refill.refill_fn(m.config, m.options, slots=G, block=1, **kw)
        return sampling.generate_fn(m.config, m.options, **kw)
    return partial.InFlight(_cfg(**rollout), mesh=mesh, first=make(G), sampler=make(1),
                            pad_id=0, is_eos=lambda t: np.isin(t, EOS))


@pytest.fixture(scope="module")
def model():
    return models.init(CFG, jax.random.key(0), dtype=jnp.float32, param_dtype=jnp.float32)


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh(data=1, devices=jax.devices()[:1])


def _steps(flight, collector, m, steps):
    got = []
    for s in range(steps):
        records, prompts, out = flight.sample(collector, jax.random.key(100 + s), m.params)
        got.append((records, prompts, tuple(sharding.host_array(x) for x in out),
                    dict(flight.metrics)))
    return got


def _forward_logprobs(m, prompts, tokens, lengths):
    """Log-probs of each response token from one forward pass over prompt + response."""
    prompt_mask = np.arange(P)[None] >= P - np.repeat(prompts.lengths, G)[:, None]
    full = np.concatenate([np.repeat(prompts.tokens, G, 0), tokens], 1)
    mask = np.concatenate([prompt_mask, np.arange(N)[None] < lengths[:, None]], 1)
    lp = models.token_logprobs(m.config, m.options, m.params, jnp.asarray(full),
                               jnp.asarray(mask)).logprobs
    return np.asarray(lp)[:, P:]


@pytest.mark.parametrize("with_refill", [False, True])
def test_carried_rows_continue_from_their_prefix_with_their_own_log_probs(model, mesh,
                                                                         with_refill):
    flight, collector = _flight(model, mesh, refill=with_refill), _collector(mesh)
    steps = _steps(flight, collector, model, 4)
    carried = [s[3]["partial_rows_carried"] for s in steps]
    assert max(carried) > 0  # rows left mid-response at some step's end
    for s, (records, prompts, (tokens, lengths, logprobs, entropy), metrics) in enumerate(steps):
        assert len(records) == B and tokens.shape == (B * G, N)
        # Whole groups, each row ended with EOS or at N.
        last = tokens[np.arange(B * G), lengths - 1]
        assert (np.isin(last, EOS) | (lengths == N)).all()
        assert (tokens[np.arange(N)[None] >= lengths[:, None]] == 0).all()
        # A row decoded over several rounds and steps, each continued from its prefix
        # re-encoded with the prompt: every token's log-prob is the one-pass forward pass's
        # (the weights are the same here at every step).
        ref = _forward_logprobs(model, prompts, tokens, lengths)
        valid = np.arange(N)[None] < lengths[:, None]
        np.testing.assert_allclose(np.where(valid, logprobs, 0), np.where(valid, ref, 0),
                                   atol=2e-4)
        assert (logprobs[valid] < 0).all() and np.isfinite(entropy).all()
        assert metrics["policy_lag_max"] <= s and 0 <= metrics["policy_lag"]
    # The learned groups are the records in the order they entered the flight, those that
    # finished first at each step: each record is learned once.
    learned = [r["q"] for s in steps for r in s[0]]
    assert len(set(learned)) == len(learned)
    # Some step learned tokens sampled by an earlier one.
    assert max(s[3]["policy_lag"] for s in steps) > 0


def test_policy_lag_counts_tokens_by_the_step_that_sampled_them(model, mesh):
    flight, collector = _flight(model, mesh), _collector(mesh)
    _steps(flight, collector, model, 1)
    lags = []
    for step in (1, 2, 3, 4):
        before = flight.flight
        (records, _, (_, lengths, _, _), m), = _steps(flight, collector, model, 1)
        # By hand: the learned rows' tokens sampled before this step keep their step; the
        # rest (all of a prompt that entered at this step) were sampled by it; each lags
        # (this step - the step that sampled it).
        lag = np.zeros((B * G, N))
        for j, record in enumerate(records):
            k = np.flatnonzero(before.index == collector.records.index(record))
            if len(k):
                rows = k[0] * G + np.arange(G)
                old = np.arange(N)[None] < before.lengths[rows][:, None]
                lag[j * G:(j + 1) * G] = np.where(old, step - before.born[rows], 0)
        assert m["policy_lag"] == pytest.approx(lag.sum() / lengths.sum())
        assert m["policy_lag_max"] == lag.max()
        lags.append(m["policy_lag"])
    assert max(lags) > 0  # some step learned carried tokens


def test_a_restored_flight_samples_what_the_uninterrupted_one_does(model, mesh):
    a, collector = _flight(model, mesh), _collector(mesh)
    _steps(a, collector, model, 2)
    saved, position = a.saved(), collector.order.position
    ref = _steps(a, collector, model, 2)
    b, again = _flight(model, mesh), _collector(mesh)
    again.order.next_indices(position)  # the data position the checkpoint holds
    b.restored({k: np.array(v) for k, v in saved.items()})
    got = _steps(b, again, model, 2)
    for (r1, p1, o1, m1), (r2, p2, o2, m2) in zip(ref, got):
        assert r1 == r2 and m1 == m2
        for x, y in zip((*p1[:2], *o1), (*p2[:2], *o2)):
            np.testing.assert_array_equal(x, y)


def test_partial_rollouts_take_whole_rounds_and_the_samplers_log_probs():
    base = [("rollout.partial", "true")]
    for bad, key in (([("rollout.max_new_tokens", "30")], "partial_tokens"),
                     ([("rollout.top_p", "0.9")], "rollout.partial"),
                     ([("rollout.dynamic_sampling", "true")], "rollout.partial"),
                     ([("rollout.partial_prompts", "1")], "partial_prompts"),
                     ([("mesh.rollout.devices", "1")], "mesh.rollout.devices")):
        with pytest.raises(ConfigError, match=key):
            load("configs/ibpo_gspo.py:smoke", base + bad)
    cfg = load("configs/ibpo_gspo.py:smoke", base).rollout
    assert cfg.round_tokens == cfg.max_new_tokens // 4
    assert cfg.prompts_in_flight == 2 * cfg.prompts_per_step


@pytest.mark.usefixtures("one_device")
def test_partial_run_matches_the_mesh_and_resumes_bitwise(smoke_data_dir, tmp_path):
    knobs = {"rollout.partial": True, "rollout.partial_tokens": 8,
             "rollout.partial_prompts": 6}
    ref = run_match_mesh_resume(smoke_data_dir, tmp_path, knobs,
                                exact=(*SMOKE_EXACT, "policy_lag", "partial_rows_carried"))
    # Each step learned B x G finished rows and charged them once; some carried rows over,
    # and a later step learned tokens an earlier one sampled, its ratio to that policy.
    assert [r["budget_trajectories"] for r in ref[1:]] == [16, 32, 48, 64]
    assert sum(r["partial_rows_carried"] for r in ref[1:]) > 0
    assert ref[1]["policy_lag"] == 0 < max(r["policy_lag"] for r in ref[2:])
    # Every checkpoint holds the flight.
    ckpt = loop.Checkpointer(tmp_path / "one" / "checkpoints")
    assert ckpt.meta(2)[checkpoint.ARRAYS] == checkpoint.ARRAYS_FILE
    assert len(ckpt.arrays(2)["partial_index"]) == 6 - 4


def test_a_checkpoint_of_the_other_schedule_leaves_each_empty(model, mesh):
    """Resumed under train.allow_config_change across rollout.partial: neither schedule reads
    the other's arrays."""
    flight = _flight(model, mesh)
    meta = {checkpoint.ARRAYS: checkpoint.ARRAYS_FILE}
    partial.Partial(None, flight).restored(meta, lambda: {"tokens_0": np.zeros((2, 3))})
    assert len(flight.flight.index) == 0 and flight.step == 0
    placement = types.SimpleNamespace(replay=[])
    off = offpolicy.OffPolicy.__new__(offpolicy.OffPolicy)
    off.placement = placement
    off.restored(meta, lambda: flight.saved())
    assert placement.replay == []
