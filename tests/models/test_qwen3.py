"""The Qwen3 model against HF transformers' Qwen3ForCausalLM (fp32 logits parity), and the
model options (scan, remat, bf16) against the plain model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ibpo_jax import models
from tests.models.hf_helpers import hf_logits, hf_model, saved

# Each covers tied/untied, a GQA ratio (1, 2, 4) and head_dim vs hidden/heads (64/heads).
PARITY = {
    "tied-gqa1-hd24": dict(num_attention_heads=4, num_key_value_heads=4, head_dim=24,
                           tie_word_embeddings=True),
    "untied-gqa2-hd16": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "untied-gqa4-hd12": dict(num_attention_heads=8, num_key_value_heads=2, head_dim=12),
}


@pytest.fixture(scope="module", params=list(PARITY))
def pair(request, tmp_path_factory):
    hf = hf_model(**PARITY[request.param])
    return hf, models.load_hf(saved(hf, tmp_path_factory.mktemp(request.param)))


# Every attention kernel that runs on CPU (splash through its Pallas interpreter); chunked with
# tiles smaller than the rows (T = 9), so that its loops, padding and block skipping run.
CPU_ATTENTION = {
    "dense": dict(attention="dense"),
    "chunked": dict(attention="chunked", attention_block_q=4, attention_block_kv=4),
    "splash": dict(attention="splash"),
}


def with_attention(m, impl):
    return dataclasses.replace(m, options=dataclasses.replace(m.options, **CPU_ATTENTION[impl]))


@pytest.mark.parametrize("impl", list(CPU_ATTENTION))
def test_logits_match_hf_with_left_padding(pair, batch, impl):
    hf, m = pair
    m = with_attention(m, impl)
    tokens, mask = batch
    ours = np.asarray(m(tokens, attention_mask=mask))
    assert ours.dtype == np.float32 and ours.shape == (*tokens.shape, 128)
    valid = mask.astype(bool)
    assert np.abs(ours - hf_logits(hf, tokens, mask))[valid].max() <= 1e-4


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_logits_match_hf_without_mask(pair, impl):
    hf, m = pair
    m = with_attention(m, impl)
    tokens = np.random.default_rng(1).integers(0, 128, (2, 7))
    with torch.no_grad():
        ref = hf(torch.from_numpy(tokens)).logits.numpy()
    assert np.abs(np.asarray(m(tokens)) - ref).max() <= 1e-4


def test_scan_layers_and_remat_change_nothing(gqa2, batch):
    _, path = gqa2
    tokens, mask = (jnp.asarray(a) for a in batch)
    base = models.load_hf(path)
    scanned = models.load_hf(path, scan_layers=True)
    assert scanned.params["layers"]["attn"]["q_proj"].shape[0] == 2  # stacked [L, ...]
    np.testing.assert_allclose(scanned(tokens, mask), base(tokens, mask), atol=1e-5)

    def grads(m):
        def loss(params):
            return -jnp.sum(models.token_logprobs(m.config, m.options, params, tokens,
                                                  mask).logprobs)
        return jax.jit(jax.grad(loss))(m.params)

    want = grads(base)
    for m in (models.load_hf(path, remat="full"),
              models.load_hf(path, remat="dots", scan_layers=True)):
        got = grads(m)
        if m.options.scan_layers:  # unstack to compare with the unrolled layout
            got = {k: v for k, v in got.items() if k != "layers"} | {
                f"layers_{i}": jax.tree.map(lambda a, i=i: a[i], got["layers"])
                for i in range(2)}
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), got, want)


def test_bfloat16_is_close_to_float32(gqa2, batch):
    _, path = gqa2
    tokens, mask = batch
    f32 = np.asarray(models.load_hf(path)(tokens, mask))
    m16 = models.load_hf(path, dtype=jnp.bfloat16)
    assert m16.params["embedding"].dtype == jnp.bfloat16
    b16 = np.asarray(m16(tokens, mask))
    assert b16.dtype == np.float32  # logits always float32
    valid = mask.astype(bool)
    assert np.abs(b16 - f32)[valid].max() <= 0.05 * np.abs(f32[valid]).max()
