"""Attention kernels against a naive softmax attention (values and autodiff gradients)."""

import jax
import jax.numpy as jnp
import numpy as np

from ibpo_jax.models import attention

B, K, G, T, H = 2, 2, 3, 5, 8


def naive(q, k, v, allowed):
    """q [B, K, G, T, H], k/v [B, K, S, H], allowed [B, T, S]; plain jax autodiff reference."""
    s = jnp.einsum("bkgth,bksh->bkgts", q, k) / np.sqrt(q.shape[-1])
    s = jnp.where(allowed[:, None, None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    p = jnp.where(allowed[:, None, None].any(-1, keepdims=True), p, 1.0 / s.shape[-1])
    return jnp.einsum("bkgts,bksh->bkgth", p, v)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32)
               for s in ((B, K, G, T, H), (B, K, T, H), (B, K, T, H)))
    mask = np.ones((B, T), bool)
    mask[1, :2] = False  # left padding: rows 0-1 of batch 1 see no key at all
    allowed = np.tril(np.ones((T, T), bool))[None] & mask[:, None, :]
    return q, k, v, jnp.asarray(allowed)


def test_self_attention_values_and_gradients_match_naive():
    q, k, v, allowed = _inputs()
    bias = attention.mask_bias(allowed)
    np.testing.assert_allclose(attention.self_attention(q, k, v, bias), naive(q, k, v, allowed),
                               atol=1e-5)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((B, K, G, T, H)), jnp.float32)
    ours = jax.grad(lambda *a: jnp.sum(w * attention.self_attention(*a, bias)),
                    argnums=(0, 1, 2))(q, k, v)
    ref = jax.grad(lambda *a: jnp.sum(w * naive(*a, allowed)), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(ours, ref):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_self_attention_gradient_matches_finite_differences():
    q, k, v, allowed = _inputs(2)
    bias = attention.mask_bias(allowed)
    f = lambda x: jnp.sum(jnp.sin(attention.self_attention(x, k, v, bias)))  # noqa: E731
    direction = jnp.asarray(np.random.default_rng(3).standard_normal(q.shape), jnp.float32)
    eps = 1e-3
    numeric = (f(q + eps * direction) - f(q - eps * direction)) / (2 * eps)
    analytic = jnp.sum(jax.grad(f)(q) * direction)
    assert abs(float(numeric) - float(analytic)) <= 2e-3 * max(1.0, abs(float(analytic)))


def test_decode_attention_equals_attention_over_the_concatenated_cache():
    """R = 2 rows share each prompt's cache; row r's own generated keys follow the prompt."""
    rng = np.random.default_rng(4)
    r, p, n, written = 2, 4, 6, 3
    q = jnp.asarray(rng.standard_normal((B * r, K, G, H)), jnp.float32)
    pk, pv = (jnp.asarray(rng.standard_normal((B, K, p, H)), jnp.float32) for _ in range(2))
    gk, gv = (jnp.asarray(rng.standard_normal((B * r, K, n, H)), jnp.float32) for _ in range(2))
    prompt_mask = np.ones((B, p), bool)
    prompt_mask[0, :1] = False
    out = attention.decode_attention(q, pk.swapaxes(-1, -2), pv, gk.swapaxes(-1, -2), gv,
                                     jnp.asarray(prompt_mask), jnp.arange(n) < written)
    for row in range(B * r):
        b = row // r
        keys = jnp.concatenate([pk[b], gk[row]], axis=1)[None]  # [1, K, P + N, H]
        values = jnp.concatenate([pv[b], gv[row]], axis=1)[None]
        allowed = np.concatenate([prompt_mask[b], np.arange(n) < written])[None, None]
        ref = naive(q[row][None, :, :, None], keys, values, jnp.asarray(allowed))
        np.testing.assert_allclose(out[row], ref[0, :, :, 0], atol=1e-5)
