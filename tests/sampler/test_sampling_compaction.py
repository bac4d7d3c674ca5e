"""The sampler at scale: finished rows dropped between decode legs (same samples, fewer
row-steps) and the compute-dtype copy of the weights that decode reads, in its layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import models
from ibpo_jax.models import kv_cache
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import sampling

CFG = models.Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, initializer_range=0.3)
EOS = tuple(range(100, 116))  # 1/8 of the vocabulary: rows end at scattered steps
N = 40  # new tokens: legs of 16, 32 and 39 slots


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    return rng.integers(1, 100, (4, 6)).astype(np.int32), np.array([6, 2, 4, 1], np.int32)


@pytest.fixture
def traced(monkeypatch):
    """(rows, params dtype of a matrix) of every decode leg the sampler compiles."""
    seen = []
    segment = sampling._Sampler.segment

    def spy(self, params, state, stop, total):
        seen.append((state.tokens.shape[0], params["embedding"].dtype))
        return segment(self, params, state, stop, total)

    monkeypatch.setattr(sampling._Sampler, "segment", spy)
    sampling._compiled.cache_clear()
    yield seen
    sampling._compiled.cache_clear()


def _sample(m, prompts, *, compact, mesh=None, **kw):
    fn = sampling.generate_fn(m.config, m.options, max_new_tokens=N, temperature=1.0,
                              eos_ids=EOS, num_samples=4, mesh=mesh, compact=compact, **kw)
    params = m.params if mesh is None else models.place_params(m.params, mesh)
    out = fn(params, *prompts, jax.random.key(7))
    return tuple(sharding.host_array(x) for x in out)


@pytest.mark.parametrize("dtype, scan", [(jnp.float32, False), (jnp.bfloat16, True)])
def test_compaction_samples_the_same_tokens_with_fewer_rows(prompts, traced, dtype, scan):
    m = models.init(CFG, jax.random.key(0), dtype=dtype, param_dtype=jnp.float32,
                    scan_layers=scan)
    tokens, lengths, logp, ent = _sample(m, prompts, compact=False)
    plain = {rows for rows, _ in traced}
    traced.clear()
    c_tokens, c_lengths, c_logp, c_ent = _sample(m, prompts, compact=True)
    assert plain == {16} and min(r for r, _ in traced) < 16  # rows were dropped
    assert len(set(lengths.tolist())) > 4  # rows end at different steps
    np.testing.assert_array_equal(c_tokens, tokens)
    np.testing.assert_array_equal(c_lengths, lengths)
    # The same uniforms per row (so the same tokens); XLA:CPU fuses decode attention's
    # reductions differently per row count, so float32 log-probs agree to rounding only.
    np.testing.assert_allclose(c_logp, logp, rtol=0, atol=1e-5)
    assert (c_logp[np.arange(N)[None] >= lengths[:, None]] == 0).all()
    np.testing.assert_allclose(c_ent, ent, rtol=1e-4)  # Σ entropy per row, the same rows
    assert (ent > 0).all()
    run, _ = kv_cache.row_steps(lengths, N, compact=True)
    assert run < kv_cache.row_steps(lengths, N, compact=False)[0]


def test_compaction_on_a_mesh_equals_one_device_without_it(prompts, traced):
    m = models.init(CFG, jax.random.key(0))
    ref = _sample(m, prompts, compact=False)
    traced.clear()
    got = _sample(m, prompts, compact=True, mesh=sharding.make_mesh(data=2, fsdp=2, tensor=2))
    assert {r for r, _ in traced} <= {16, 8, 4} and min(r for r, _ in traced) < 16
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-5, atol=1e-5)  # sums split over devices
    np.testing.assert_allclose(got[3], ref[3], rtol=1e-5)  # Σ entropy per row


def test_decode_reads_a_bf16_copy_and_bf16_weights_give_the_same_logits(prompts, traced):
    m = models.init(CFG, jax.random.key(1), dtype=jnp.bfloat16, param_dtype=jnp.float32)
    _sample(m, prompts, compact=True)
    assert {dt for _, dt in traced} == {jnp.dtype(jnp.bfloat16)}
    w = sampling.compute_weights(m.params, jnp.bfloat16)
    assert w["layers_0"]["attn"]["q_proj"].dtype == jnp.bfloat16
    assert w["layers_0"]["input_norm"].dtype == jnp.float32  # vectors: read in float32 anyway
    tokens, mask = jnp.asarray(prompts[0]), jnp.ones(prompts[0].shape, bool)
    a = models.forward(m.config, m.options, m.params, tokens, mask)
    b = models.forward(m.config, m.options, w, tokens, mask)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    f32 = models.init(CFG, jax.random.key(1))
    assert jax.tree.all(jax.tree.map(lambda x, y: x is y, f32.params,
                                     sampling.compute_weights(f32.params, jnp.float32)))


@pytest.mark.parametrize("name", ["replicated", "fsdp"])
def test_sampling_weights_take_the_layout_on_a_mesh(name):
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    m = models.init(CFG, jax.random.key(0), dtype=jnp.bfloat16, param_dtype=jnp.float32,
                    mesh=mesh)
    layout = sharding.SAMPLING_LAYOUTS[name]
    fn = sampling.generate_fn(m.config, m.options, max_new_tokens=4, mesh=mesh, layout=layout)
    with jax.set_mesh(mesh):
        w = fn.weights(m.params)
    want = sharding.param_shardings(m.params, mesh, layout)
    for leaf, spec, (path, _) in zip(jax.tree.leaves(w), jax.tree.leaves(want),
                                        jax.tree_util.tree_leaves_with_path(m.params)):
        vector = sharding.PARAM_FIELDS[path[-1].key] == "vector"
        assert leaf.dtype == (jnp.float32 if vector else jnp.bfloat16), path
        assert leaf.sharding.is_equivalent_to(spec, leaf.ndim), (path, leaf.sharding.spec)
    q = w["layers_0"]["attn"]["q_proj"]  # [D, N, H]: D whole (replicated) or over fsdp
    assert q.addressable_shards[0].data.shape[0] == (64 if name == "replicated" else 32)
    per_device = sharding.param_bytes_per_device(m.params, mesh, layout, jnp.bfloat16)
    assert per_device == sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(w))
