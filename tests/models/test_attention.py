"""Attention kernels against a naive softmax attention (values and autodiff gradients): every
implementation that runs on CPU, every mask the model builds, and chunked's memory scaling."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax.models import attention, attention_chunked, attention_fused

B, K, G, H = 2, 2, 3, 8


def naive(q, k, v, allowed):
    """q [B, K, G, T, H], k/v [B, K, S, H], allowed [B, T, S]; plain jax autodiff reference
    (a row that sees no key gives 0)."""
    s = jnp.einsum("bkgth,bksh->bkgts", q, k) / np.sqrt(q.shape[-1])
    s = jnp.where(allowed[:, None, None], s, -jnp.inf)
    any_key = allowed[:, None, None].any(-1, keepdims=True)
    p = jax.nn.softmax(jnp.where(any_key, s, 0.0), axis=-1)
    return jnp.einsum("bkgts,bksh->bkgth", jnp.where(any_key, p, 0.0), v)


def _valid(lengths, t, left):
    idx = np.arange(t)[None]
    n = np.asarray(lengths)[:, None]
    return jnp.asarray(idx >= t - n if left else idx < n)


def _masks():
    """name -> (Mask, T, S). T = 13 and S = 13 or 12 are not multiples of the test blocks."""
    t = 13
    packed = np.zeros((B, t), np.int32)
    packed[0, :5], packed[0, 5:11] = 1, 2  # two sequences, then padding
    packed[1, :3], packed[1, 3:6], packed[1, 6:] = 4, 0, 7  # a padding gap inside the row
    prompt = _valid((5, 2), 5, left=True)  # grouped: P = 5, R = 1, C = 7
    return {
        "causal": (attention.causal_mask(jnp.ones((B, t), bool)), t, t),
        "left_padding": (attention.causal_mask(_valid((13, 6), t, left=True)), t, t),
        "right_padding": (attention.causal_mask(_valid((9, 1), t, left=False)), t, t),
        "packed": (attention.causal_mask(jnp.asarray(packed > 0), jnp.asarray(packed)), t, t),
        "grouped": (attention.grouped_mask(prompt, 1, 7), 7, 12),
        "fully_masked_row": (attention.causal_mask(_valid((13, 0), t, left=True)), t, t),
    }


MASKS = _masks()


def _inputs(t, s, seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    q, k, v, w = (jnp.asarray(rng.standard_normal(shape), dtype)
                  for shape in ((B, K, G, t, H), (B, K, s, H), (B, K, s, H), (B, K, G, t, H)))
    return q, k, v, w


def _run(impl, q, k, v, mask):
    if impl == "cudnn_as_xla":  # cuDNN's argument mapping, through XLA's implementation
        scaled = q * q.shape[-1] ** -0.5
        return attention_fused.cudnn_attention(scaled, k, v, mask, implementation="xla")
    if impl == "chunked":  # tiles smaller than T and S, neither dividing them
        return attention.self_attention(q, k, v, mask, "chunked", block_q=4, block_kv=5)
    return attention.self_attention(q, k, v, mask, impl)


CPU_IMPLEMENTATIONS = ("dense", "chunked", "cudnn_as_xla", "auto")


def _value_and_grads(fn, q, k, v, w, mask):
    """Jitted fn(q, k, v, mask) and the gradients of sum(w * fn) with respect to q, k, v."""
    out = jax.jit(fn)(q, k, v, mask)
    loss = lambda q, k, v, mask: jnp.sum(w * fn(q, k, v, mask))  # noqa: E731
    return out, jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, mask)


@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("impl", CPU_IMPLEMENTATIONS)
def test_values_and_gradients_match_naive(impl, name):
    mask, t, s = MASKS[name]
    q, k, v, w = _inputs(t, s)
    out, ours = _value_and_grads(functools.partial(_run, impl), q, k, v, w, mask)
    want, ref = _value_and_grads(lambda q, k, v, m: naive(q, k, v, m.allowed()), q, k, v, w,
                                 mask)
    np.testing.assert_allclose(out, want, atol=1e-5)
    for a, b in zip(ours, ref):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_rows_that_see_no_key_give_zero_and_pass_no_gradient():
    mask, t, s = MASKS["fully_masked_row"]  # row 1 all padding; row 0 fully real
    q, k, v, w = _inputs(t, s, seed=5)
    for impl in CPU_IMPLEMENTATIONS:
        out, grads = _value_and_grads(functools.partial(_run, impl), q, k, v, w, mask)
        assert np.all(np.asarray(out[1]) == 0), impl
        for g in grads:
            assert np.all(np.asarray(g[1]) == 0), impl
            assert np.abs(np.asarray(g[0])).max() > 1e-3, impl


@pytest.mark.parametrize("name", ["left_padding", "packed", "grouped"])
def test_splash_in_pallas_interpret_mode_matches_naive(name):
    """The TPU kernel through its Pallas interpreter (tiles of 128: T, S padded up)."""
    mask, t, s = MASKS[name]
    q, k, v, w = _inputs(t, s, seed=1)
    allowed = mask.allowed()
    np.testing.assert_allclose(attention.self_attention(q, k, v, mask, "splash"),
                               naive(q, k, v, allowed), atol=1e-5)
    if name == "grouped":  # one backward (the interpreter is slow)
        ours = jax.grad(lambda *a: jnp.sum(w * attention.self_attention(*a, mask, "splash")),
                        argnums=(0, 1, 2))(q, k, v)
        ref = jax.grad(lambda *a: jnp.sum(w * naive(*a, allowed)), argnums=(0, 1, 2))(q, k, v)
        for a, b in zip(ours, ref):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_dense_gradient_matches_finite_differences():
    mask, t, s = MASKS["left_padding"]
    q, k, v, _ = _inputs(t, s, seed=2)
    f = lambda x: jnp.sum(jnp.sin(attention.self_attention(x, k, v, mask, "dense")))  # noqa: E731
    direction = jnp.asarray(np.random.default_rng(3).standard_normal(q.shape), jnp.float32)
    eps = 1e-3
    numeric = (f(q + eps * direction) - f(q - eps * direction)) / (2 * eps)
    analytic = jnp.sum(jax.grad(f)(q) * direction)
    assert abs(float(numeric) - float(analytic)) <= 2e-3 * max(1.0, abs(float(analytic)))


def test_chunked_in_bfloat16_is_close_to_dense():
    mask, t, s = MASKS["packed"]
    q, k, v, _ = _inputs(t, s, seed=6, dtype=jnp.bfloat16)
    got = attention.self_attention(q, k, v, mask, "chunked", block_q=4, block_kv=4)
    want = attention.self_attention(q, k, v, mask, "dense")
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               atol=3e-2)


def test_auto_picks_dense_for_short_and_chunked_for_long_rows_on_cpu():
    assert jax.default_backend() == "cpu"
    n = int(np.sqrt(attention.CPU_DENSE_MAX_TS))
    assert attention.choose("auto", n, n, jnp.float32, False) == "dense"
    assert attention.choose("auto", 2 * n, 2 * n, jnp.float32, False) == "chunked"
    assert attention.choose("splash", 8, 8, jnp.float32, True) == "splash"
    with pytest.raises(ValueError, match="valid"):
        attention.choose("flash", 8, 8, jnp.float32, False)


def _temp_bytes(t, impl="chunked"):
    """Compiled temp memory of forward + backward of one call at T = S = t (K 1, G 2, H 16)."""
    mask = attention.causal_mask(jnp.ones((1, t), bool))
    q = jax.ShapeDtypeStruct((1, 1, 2, t, 16), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, 1, t, 16), jnp.float32)

    def loss(q, k, v):
        return jnp.sum(attention.self_attention(q, k, v, mask, impl, block_q=256, block_kv=256))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    return grad.lower(q, kv, kv).compile().memory_analysis().temp_size_in_bytes


def test_chunked_memory_is_linear_in_length():
    """Quadrupling T quadruples chunked's temp memory (dense's would grow ~16x)."""
    small, large = _temp_bytes(2048), _temp_bytes(8192)
    assert large / small <= 4.5, (small, large)
    assert large < _temp_bytes(2048, "dense")  # 4x the length in less than dense at 1x


def test_chunked_skips_key_blocks_past_the_causal_window():
    plan = attention_chunked._Plan.of(t=10, s=14, block_q=4, block_kv=4)  # offset 4
    assert (plan.nq, plan.nk, plan.tp, plan.sp) == (3, 4, 12, 16)
    assert [int(plan.kv_end(i)) for i in range(3)] == [2, 3, 4]


def _decode_inputs(rng, r, p, n):
    q = jnp.asarray(rng.standard_normal((B * r, K, G, H)), jnp.float32)
    pk, pv = (jnp.asarray(rng.standard_normal((B, K, p, H)), jnp.float32) for _ in range(2))
    gk, gv = (jnp.asarray(rng.standard_normal((B * r, K, n, H)), jnp.float32) for _ in range(2))
    prompt_mask = np.ones((B, p), bool)
    prompt_mask[0, :1] = False
    return q, pk, pv, gk, gv, prompt_mask


def _decode_reference(q, pk, pv, gk, gv, prompt_mask, gen_mask, r):
    out = []
    for row in range(B * r):
        b = row // r
        keys = jnp.concatenate([pk[b], gk[row]], axis=1)[None]  # [1, K, P + N, H]
        values = jnp.concatenate([pv[b], gv[row]], axis=1)[None]
        own = gen_mask[row] if gen_mask.ndim == 2 else gen_mask
        allowed = np.concatenate([prompt_mask[b], own])[None, None]
        out.append(naive(q[row][None, :, :, None], keys, values, jnp.asarray(allowed))[0, :, :, 0])
    return np.stack(out)


@pytest.mark.parametrize("n,written,block", [(6, 3, 256), (11, 9, 4), (11, 11, 4), (12, 1, 4)])
def test_decode_attention_equals_attention_over_the_concatenated_cache(n, written, block):
    """R = 2 rows share each prompt's cache; row r's own generated keys follow the prompt.
    block < n: the blockwise path (N not a multiple of the block, partly filled caches)."""
    r, p = 2, 4
    q, pk, pv, gk, gv, prompt_mask = _decode_inputs(np.random.default_rng(4), r, p, n)
    gen_mask = np.arange(n) < written
    out = attention.decode_attention(q, pk.swapaxes(-1, -2), pv, gk.swapaxes(-1, -2), gv,
                                     jnp.asarray(prompt_mask), jnp.asarray(gen_mask), block)
    np.testing.assert_allclose(out, _decode_reference(q, pk, pv, gk, gv, prompt_mask,
                                                      gen_mask, r), atol=1e-5)


@pytest.mark.parametrize("block", [256, 4])
def test_decode_attention_with_a_mask_per_row(block):
    """[B*R, N] masks (slot refill's ring: each row its own scattered slots) give each row
    attention over exactly its own slots, in one pass and blockwise."""
    r, p, n = 2, 4, 11
    q, pk, pv, gk, gv, prompt_mask = _decode_inputs(np.random.default_rng(5), r, p, n)
    gen_mask = np.random.default_rng(6).random((B * r, n)) < 0.5
    gen_mask[:, 3] = True  # at least one slot per row
    out = attention.decode_attention(q, pk.swapaxes(-1, -2), pv, gk.swapaxes(-1, -2), gv,
                                     jnp.asarray(prompt_mask), jnp.asarray(gen_mask), block)
    np.testing.assert_allclose(out, _decode_reference(q, pk, pv, gk, gv, prompt_mask,
                                                      gen_mask, r), atol=1e-5)


def test_decode_attention_reads_no_slot_past_the_last_written_one():
    """Garbage (NaN) past the written slots never reaches the output in the blockwise path."""
    r, p, n, written = 1, 3, 20, 6
    q, pk, pv, gk, gv, prompt_mask = _decode_inputs(np.random.default_rng(7), r, p, n)
    gen_mask = np.arange(n) < written
    gk_nan, gv_nan = (a.at[:, :, 8:].set(jnp.nan) for a in (gk, gv))  # blocks 2+ of 4 slots
    out = attention.decode_attention(q, pk.swapaxes(-1, -2), pv, gk_nan.swapaxes(-1, -2),
                                     gv_nan, jnp.asarray(prompt_mask), jnp.asarray(gen_mask), 4)
    np.testing.assert_allclose(out, _decode_reference(q, pk, pv, gk, gv, prompt_mask,
                                                      gen_mask, r), atol=1e-5)


def test_auto_on_tpu_and_gpu_follows_the_platform_and_the_mesh(monkeypatch):
    """GPU: cuDNN for 16-bit unpacked rows, else chunked; TPU: splash on one chip, chunked under
    a mesh of several devices (the Pallas kernel has no partitioning rule)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert attention.choose("auto", 64, 64, jnp.bfloat16, False) == "cudnn"
    assert attention.choose("auto", 64, 64, jnp.float32, False) == "chunked"
    assert attention.choose("auto", 64, 64, jnp.bfloat16, True) == "chunked"
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert attention.choose("auto", 64, 64, jnp.bfloat16, False) == "splash"
    with jax.set_mesh(jax.make_mesh((2,), ("fsdp",))):  # tests/conftest.py: 8 CPU devices
        assert attention.choose("auto", 64, 64, jnp.bfloat16, False) == "chunked"
