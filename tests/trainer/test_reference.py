"""The frozen reference policy: its matrices in the compute dtype (bf16 runs), the same
log-probs, and runs resumed from checkpoints of the fp32 era."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import config, models
from ibpo_jax.trainer import loop
from ibpo_jax.trainer.checkpoint import Checkpointer
from ibpo_jax.trainer.state import frozen_reference

CFG = models.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, initializer_range=0.3)


def _matrices_and_vectors(params):
    leaves = jax.tree_util.tree_leaves_with_path(params)
    is_vec = lambda p: p[-1].key.endswith("norm")  # noqa: E731
    return ({x.dtype for p, x in leaves if not is_vec(p)},
            {x.dtype for p, x in leaves if is_vec(p)})


@pytest.mark.parametrize("scan", [False, True])
def test_bf16_reference_has_own_buffers_and_the_same_logprobs(scan):
    m = models.init(CFG, jax.random.key(0), dtype=jnp.bfloat16, param_dtype=jnp.float32,
                    scan_layers=scan)
    ref = frozen_reference(m.params, m.options.dtype)
    assert _matrices_and_vectors(ref) == ({jnp.dtype(jnp.bfloat16)}, {jnp.dtype(jnp.float32)})
    assert not any(a is b for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(m.params)))
    tokens = jax.random.randint(jax.random.key(1), (3, 9), 0, 64)
    lp = lambda p: models.token_logprobs(CFG, m.options, p, tokens).logprobs  # noqa: E731
    np.testing.assert_array_equal(np.asarray(lp(ref)), np.asarray(lp(m.params)))


def test_fp32_reference_stays_fp32_in_new_buffers():
    m = models.init(CFG, jax.random.key(0))
    ref = frozen_reference(m.params, m.options.dtype)
    assert _matrices_and_vectors(ref) == ({jnp.dtype(jnp.float32)}, {jnp.dtype(jnp.float32)})
    assert not any(a is b for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(m.params)))


def test_bf16_run_keeps_a_bf16_reference_and_resumes_an_fp32_era_checkpoint(smoke_data_dir,
                                                                             tmp_path):
    """A checkpoint holds the policy's state only (fp32 params, as before this change); a
    bf16-compute run resumes it and rebuilds its bf16 reference from the base."""
    cfg = config.load("configs/ibpo_gspo.py:smoke", [
        ("task.data_dir", str(smoke_data_dir)), ("model.dtype", "bfloat16")])
    first = loop.Trainer(cfg, tmp_path)
    try:
        assert _matrices_and_vectors(first.state.params)[0] == {jnp.dtype(jnp.float32)}
        assert _matrices_and_vectors(first.parts.base.params) == ({jnp.dtype(jnp.bfloat16)},
                                                            {jnp.dtype(jnp.float32)})
        state = first.state._replace(params=jax.tree.map(lambda x: x + 1e-3, first.state.params))
        ckpt = Checkpointer(tmp_path / "checkpoints")
        first.state = state
        first.save(ckpt, 3)
        ckpt.close()
    finally:
        first.close()
    second = loop.Trainer(cfg, tmp_path)
    try:
        ckpt = Checkpointer(tmp_path / "checkpoints")
        assert second.restore(ckpt) == 3
        ckpt.close()
        for a, b in zip(jax.tree.leaves(second.state.params), jax.tree.leaves(state.params)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(second.parts.base.params),
                        jax.tree.leaves(first.parts.base.params)):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)),
                                          np.asarray(b.astype(jnp.float32)))
    finally:
        second.close()
