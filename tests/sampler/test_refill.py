"""Slot refill (`sampler/refill.py`): S slots kept busy from the call's queue of B*R rows give
the one-pass sampler's samples (same uniforms per row, whichever slot and step), on one device
and on the (2, 2, 2) mesh, with fewer wasted slot-steps than decoding chunks to their longest
row."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import models
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import refill, sampling
from tests.sampler.test_sampling_compaction import CFG

N = 24
R = 3
EOS = tuple(range(100, 108))  # 1/16 of the vocabulary: ragged rows, some run to N


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(3)
    return (rng.integers(1, 100, (6, 5)).astype(np.int32),
            np.array([5, 2, 4, 1, 3, 5], np.int32))


def _host(out):
    return tuple(sharding.host_array(x) for x in out)


def _one_pass(m, prompts, **kw):
    fn = sampling.generate_fn(m.config, m.options, max_new_tokens=N, eos_ids=EOS,
                              num_samples=R, compact=False, **kw)
    return _host(fn(m.params, *prompts, jax.random.key(11)))


def _refilled(m, prompts, slots, block=None, mesh=None, **kw):
    fn = refill.refill_fn(m.config, m.options, slots=slots, block=block, max_new_tokens=N,
                          eos_ids=EOS, num_samples=R, mesh=mesh, **kw)
    params = m.params if mesh is None else models.place_params(m.params, mesh)
    return _host(fn(params, *prompts, jax.random.key(11))), fn.last_stats


def _same(got, ref, atol=1e-5):
    np.testing.assert_array_equal(got[0], ref[0])  # tokens
    np.testing.assert_array_equal(got[1], ref[1])  # lengths
    # The same uniforms per row (so the same tokens); another decode batch sums attention
    # in another order, so float32 log-probs agree to rounding only.
    np.testing.assert_allclose(got[2], ref[2], rtol=0, atol=atol)
    np.testing.assert_allclose(got[3], ref[3], rtol=1e-4)  # Σ entropy per row


@pytest.mark.parametrize("dtype, scan, shapes", [
    (jnp.float32, False, ((4, 2), (5, 3))),  # a row's samples: not its slot's
    (jnp.bfloat16, True, ((4, 2),))])  # the stacked cache's per-row writes
def test_refill_samples_what_one_pass_samples(prompts, dtype, scan, shapes):
    m = models.init(CFG, jax.random.key(0), dtype=dtype, param_dtype=jnp.float32,
                    scan_layers=scan)
    ref = _one_pass(m, prompts)
    assert len(set(ref[1].tolist())) > 4 and (ref[1] == N).any()  # ragged, some full rows
    for slots, block in shapes:
        got, stats = _refilled(m, prompts, slots, block)
        _same(got, ref, atol=1e-5 if dtype == jnp.float32 else 2e-2)
        # every token after the first is one decode step of one slot
        assert stats.slot_steps - stats.wasted_slot_steps == int(ref[1].sum()) - len(ref[1])
        assert stats.slot_steps == stats.decode_steps * slots


def test_refill_wastes_fewer_slot_steps_than_chunks_decoded_to_their_longest(prompts):
    """Chunks of `slots` rows each decode until their longest row ends (rollout.sample_chunk
    without compaction); refill runs about tokens / slots steps."""
    m = models.init(CFG, jax.random.key(0))
    lengths = _one_pass(m, prompts)[1]
    slots = 4
    chunked = sum(int(lengths[i:i + slots].max()) - 1 for i in range(0, len(lengths), slots))
    _, stats = _refilled(m, prompts, slots, 2)
    assert stats.wasted_slot_steps < chunked * slots - (int(lengths.sum()) - len(lengths))
    assert stats.decode_steps < chunked


def test_a_calls_first_rows_alone_are_the_whole_calls_and_the_rest_stay_empty(prompts):
    m = models.init(CFG, jax.random.key(0))
    fn = refill.refill_fn(m.config, m.options, slots=4, block=2, max_new_tokens=N,
                          eos_ids=EOS, num_samples=R)
    whole = _host(fn(m.params, *prompts, jax.random.key(11)))
    some = _host(fn(m.params, *prompts, jax.random.key(11), rows=7))
    _same(tuple(x[:7] for x in some), tuple(x[:7] for x in whole))
    assert not some[1][7:].any() and not some[2][7:].any() and (some[0][7:] == 0).all()
    assert fn.last_stats.slot_steps - fn.last_stats.wasted_slot_steps \
        == int(whole[1][:7].sum()) - 7


def test_greedy_refill_equals_greedy_one_pass(prompts):
    m = models.init(CFG, jax.random.key(2))
    ref = _one_pass(m, prompts, temperature=0.0)
    got, _ = _refilled(m, prompts, 4, 2, temperature=0.0)
    _same(got, ref)


def test_refill_on_a_mesh_equals_one_device(prompts):
    m = models.init(CFG, jax.random.key(0))
    ref = _one_pass(m, prompts)
    got, _ = _refilled(m, prompts, 8, 4, mesh=sharding.make_mesh(data=2, fsdp=2, tensor=2))
    _same(got, ref)


def test_bad_slot_counts_are_refused():
    m = models.init(CFG, jax.random.key(0))
    with pytest.raises(ValueError, match="slots=6: must be a positive multiple of the mesh's 4"):
        refill.refill_fn(m.config, m.options, slots=6, max_new_tokens=N,
                         mesh=sharding.make_mesh(data=2, fsdp=2, tensor=2))
    with pytest.raises(ValueError, match=r"block=5: must be in \[1, slots=4\]"):
        refill.refill_fn(m.config, m.options, slots=4, block=5, max_new_tokens=N)
