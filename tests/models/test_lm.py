"""The functional entry points (`token_logprobs`, `forward` via `Qwen3LM`) against HF
log-softmax, entropy and torch autograd gradients; chunking, temperature, the value head and
degenerate inputs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ibpo_jax import models
from ibpo_jax.models import hf_io
from tests.models.hf_helpers import hf_model, left_padded_batch, saved

_logprobs = jax.jit(models.token_logprobs, static_argnums=(0, 1),
                    static_argnames=("temperature", "return_entropy", "return_values",
                                     "logits_chunk"))


def _hf_token_logprobs(hf, tokens, mask):
    positions = torch.from_numpy(np.maximum(np.cumsum(mask, -1) - 1, 0))
    logits = hf(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask),
                position_ids=positions).logits
    lp = torch.log_softmax(logits[:, :-1], -1)
    return lp.gather(-1, torch.from_numpy(tokens[:, 1:, None]))[..., 0], logits


def test_token_logprobs_and_entropy_match_hf(gqa2, batch):
    hf, path = gqa2
    m = models.load_hf(path)
    tokens, mask = batch
    out = _logprobs(m.config, m.options, m.params, jnp.asarray(tokens), jnp.asarray(mask),
                    return_entropy=True)
    with torch.no_grad():
        ref_lp, logits = _hf_token_logprobs(hf, tokens, mask)
        p = torch.softmax(logits[:, :-1], -1)
        ref_ent = -(p * torch.log(p)).sum(-1)
    valid = (mask[:, 1:] & mask[:, :-1]).astype(bool)  # real target, real context
    lp, ent = np.asarray(out.logprobs), np.asarray(out.entropy)
    assert np.abs(lp[:, 1:] - ref_lp.numpy())[valid].max() <= 1e-4
    assert np.abs(ent[:, 1:] - ref_ent.numpy())[valid].max() <= 1e-4
    # Column 0, padding and each row's first real token (nothing real predicts it) are 0.
    assert (lp[:, 0] == 0).all() and (lp[:, 1:][~valid] == 0).all()
    assert (ent[:, 1:][~valid] == 0).all()


def test_gradients_match_torch_autograd(gqa2, batch):
    """Loss = mean next-token NLL over real tokens; every parameter's gradient vs torch's."""
    hf, path = gqa2
    m = models.load_hf(path)
    tokens, mask = batch
    real = mask[:, 1:] & mask[:, :-1]
    n_valid = real.sum()

    def loss(params):
        lp = models.token_logprobs(m.config, m.options, params, jnp.asarray(tokens),
                                   jnp.asarray(mask)).logprobs
        return -jnp.sum(lp) / n_valid

    grads = jax.jit(jax.grad(loss))(m.params)
    hf.zero_grad()
    ref_lp, _ = _hf_token_logprobs(hf, tokens, mask)
    (-(ref_lp * torch.from_numpy(real)).sum() / float(n_valid)).backward()
    ref = {name: p.grad.numpy() for name, p in hf.named_parameters()}
    seen = 0
    for name, g in hf_io.hf_tensors(m.config, grads):
        scale = np.abs(ref[name]).max()
        assert np.abs(g - ref[name]).max() <= 1e-4 * max(scale, 1.0), name
        seen += 1
    assert seen == len(ref)


def test_chunked_logprobs_equal_unchunked_with_gradients(gqa2, batch):
    _, path = gqa2
    m = models.load_hf(path)
    tokens, mask = (jnp.asarray(a) for a in batch)

    def run(chunk):
        def f(params):
            out = models.token_logprobs(m.config, m.options, params, tokens, mask,
                                        temperature=0.7, return_entropy=True,
                                        logits_chunk=chunk)
            return jnp.sum(out.logprobs) + jnp.sum(out.entropy), out
        (_, out), g = jax.jit(jax.value_and_grad(f, has_aux=True))(m.params)
        return out, g

    (full, g_full), (chunked, g_chunked) = run(0), run(3)  # 3 does not divide T - 1 = 8
    np.testing.assert_allclose(chunked.logprobs, full.logprobs, atol=1e-5)
    np.testing.assert_allclose(chunked.entropy, full.entropy, atol=1e-5)
    # Gradients reach ~10 in magnitude: float32 sums in another order differ relatively.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-5),
                 g_chunked, g_full)


def test_temperature_divides_logits(gqa2, batch):
    _, path = gqa2
    m = models.load_hf(path)
    tokens, mask = (jnp.asarray(a) for a in batch)
    lp = _logprobs(m.config, m.options, m.params, tokens, mask, temperature=0.5).logprobs
    logits = np.asarray(m(tokens, mask))[:, :-1] / 0.5
    ref = np.take_along_axis(jax.nn.log_softmax(logits, -1), np.asarray(tokens)[:, 1:, None],
                             -1)[..., 0]
    m_np = np.asarray(mask)
    valid = (m_np[:, 1:] & m_np[:, :-1]).astype(bool)
    assert np.abs(np.asarray(lp)[:, 1:] - ref)[valid].max() <= 1e-5


def test_value_head_is_a_linear_readout_of_the_final_hidden_state(tmp_path):
    # Tied model: logits[..., j] = h . E[j]. A value head set to (E[j], 0.5) must give
    # logits[..., j] + 0.5, an identity between two different code paths.
    hf = hf_model(num_attention_heads=4, num_key_value_heads=4, head_dim=24,
                  tie_word_embeddings=True)
    m = models.load_hf(saved(hf, tmp_path), value_head=True)
    params = dict(m.params, value_head=m.params["embedding"][17], value_bias=jnp.float32(0.5))
    m = models.Qwen3LM(m.config, m.options, params)
    tokens, mask = left_padded_batch(np.random.default_rng(2), (6, 3), 128)
    values = np.asarray(m.values(tokens, mask))
    assert values.shape == tokens.shape and values.dtype == np.float32
    np.testing.assert_allclose(values, np.asarray(m(tokens, mask))[..., 17] + 0.5, atol=1e-5)
    stats = _logprobs(m.config, m.options, m.params, jnp.asarray(tokens), jnp.asarray(mask),
                      return_values=True)
    np.testing.assert_allclose(stats.values, values, atol=1e-5)


def test_fully_padded_row_stays_finite(gqa2):
    _, path = gqa2
    m = models.load_hf(path)
    tokens = np.array([[3, 4, 5], [0, 0, 0]])
    mask = np.array([[1, 1, 1], [0, 0, 0]])
    assert np.isfinite(np.asarray(m(tokens, mask))).all()

    def loss(params):
        out = models.token_logprobs(m.config, m.options, params, jnp.asarray(tokens),
                                    jnp.asarray(mask), return_entropy=True)
        return jnp.sum(out.logprobs) + jnp.sum(out.entropy)

    value, grads = jax.jit(jax.value_and_grad(loss))(m.params)
    assert np.isfinite(value)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_bad_inputs_raise():
    m = models.init(models.Qwen3Config(vocab_size=16, hidden_size=8, intermediate_size=8,
                                       num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=4), jax.random.key(0))
    with pytest.raises(ValueError, match="tokens must be an int"):
        m(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="attention_mask shape"):
        m(np.zeros((2, 3), np.int32), np.ones((2, 4)))
    with pytest.raises(ValueError, match="value_head"):
        m.values(np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match="temperature"):
        models.token_logprobs(m.config, m.options, m.params, jnp.zeros((1, 3), jnp.int32),
                              temperature=0.0)


def _grouped_batch(rng, prompt_lens, r, p, n, vocab):
    """Left-padded prompts [B, P], R responses each [B*R, N] right-padded (garbage after the
    length), and the same rows concatenated with their masks."""
    b = len(prompt_lens)
    prompt = rng.integers(1, vocab, (b, p)).astype(np.int32)
    prompt[np.arange(p)[None] < (p - np.asarray(prompt_lens))[:, None]] = 0
    resp_len = rng.integers(1, n + 1, b * r)
    resp = rng.integers(1, vocab, (b * r, n)).astype(np.int32)
    rows = np.concatenate([np.repeat(prompt, r, 0), resp], 1)
    mask = np.concatenate([np.repeat(prompt > 0, r, 0),
                           np.arange(n)[None] < resp_len[:, None]], 1).astype(np.int32)
    return prompt, np.asarray(prompt_lens, np.int32), resp, resp_len, rows, mask


@pytest.mark.parametrize("options", [dict(attention="dense"),
                                     dict(attention="chunked", attention_block_q=4,
                                          attention_block_kv=4),
                                     dict(attention="splash")], ids=lambda o: o["attention"])
def test_response_logprobs_match_hf_on_whole_rows(gqa2, options):
    """Each prompt encoded once for its R responses: the responses' log-probs equal HF's on
    the concatenated prompt + response rows (every attention kernel that runs on CPU)."""
    hf, path = gqa2
    m = models.load_hf(path, **options)
    prompt, plen, resp, rlen, rows, mask = _grouped_batch(np.random.default_rng(3), (5, 2, 7),
                                                          r=3, p=7, n=6, vocab=128)
    out = models.response_logprobs(m.config, m.options, m.params, jnp.asarray(prompt),
                                   jnp.asarray(plen), jnp.asarray(resp))
    with torch.no_grad():
        ref, _ = _hf_token_logprobs(hf, rows, mask)
    valid = np.arange(6)[None] < rlen[:, None]
    got = np.asarray(out.logprobs)
    assert got.shape == resp.shape and valid.sum() > 10
    assert np.abs(got - ref.numpy()[:, 6:])[valid].max() <= 1e-4  # target column 7 + j


@pytest.mark.parametrize("opts", [{}, {"scan_layers": True, "remat": "full"}])
def test_response_logprobs_equal_token_logprobs_with_gradients(opts):
    """Log-probs, entropy, values (state before each response token) and the gradient of a
    masked sum of them: grouped encoding == whole rows, also scanned and rematerialized."""
    cfg = models.Qwen3Config(vocab_size=32, hidden_size=32, intermediate_size=48,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=8, tie_word_embeddings=False)
    m = models.init(cfg, jax.random.key(0), value_head=True, **opts)
    prompt, plen, resp, rlen, rows, mask = _grouped_batch(np.random.default_rng(4), (4, 1, 6),
                                                          r=4, p=6, n=5, vocab=32)
    valid = jnp.asarray(np.arange(5)[None] < rlen[:, None])

    def grouped(params):
        out = models.response_logprobs(cfg, m.options, params, jnp.asarray(prompt),
                                       jnp.asarray(plen), jnp.asarray(resp), temperature=0.8,
                                       return_entropy=True, return_values=True,
                                       logits_chunk=2)
        return out.logprobs, out.entropy, out.values

    def whole(params):
        out = models.token_logprobs(cfg, m.options, params, jnp.asarray(rows),
                                    jnp.asarray(mask), temperature=0.8, return_entropy=True,
                                    return_values=True)
        return out.logprobs[:, 6:], out.entropy[:, 6:], out.values[:, 5:-1]

    def loss(fn):
        return lambda p: sum(jnp.sum(jnp.where(valid, x, 0.0) * w)
                             for x, w in zip(fn(p), (1.0, 0.3, 0.1)))

    for a, b in zip(grouped(m.params), whole(m.params)):
        np.testing.assert_allclose(np.where(valid, a, 0), np.where(valid, b, 0), atol=1e-5)
    g1, g2 = (jax.jit(jax.grad(loss(f)))(m.params) for f in (grouped, whole))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), g1, g2)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g1)) > 1e-3


def test_response_logprobs_bad_shapes_raise():
    m = models.init(models.Qwen3Config(vocab_size=16, hidden_size=8, intermediate_size=8,
                                       num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=4), jax.random.key(0))
    prompt, resp = jnp.zeros((2, 3), jnp.int32), jnp.zeros((5, 4), jnp.int32)
    with pytest.raises(ValueError, match="multiple of prompt rows 2"):
        models.response_logprobs(m.config, m.options, m.params, prompt, jnp.full(2, 3), resp)


@pytest.mark.parametrize("impl", ["dense", "chunked", "splash"])
def test_packed_rows_equal_separate_rows(gqa2, impl):
    """Three sequences packed into one row (with padding between and after) give each the
    log-probs and entropies it gets alone, in every attention kernel that runs on CPU."""
    _, path = gqa2
    blocks = dict(attention_block_q=4, attention_block_kv=4) if impl == "chunked" else {}
    m = models.load_hf(path, attention=impl, **blocks)
    rng = np.random.default_rng(5)
    lengths, gaps = (4, 6, 3), (0, 2, 1)
    seqs = [rng.integers(1, 128, n) for n in lengths]
    tokens, segments = [], []
    for i, (seq, gap) in enumerate(zip(seqs, gaps)):
        tokens += [0] * gap + list(seq)
        segments += [0] * gap + [i + 1] * len(seq)
    tokens, segments = np.asarray([tokens + [0] * 2]), np.asarray([segments + [0] * 2])
    stats = jax.jit(functools.partial(models.token_logprobs, m.config, m.options,
                                      return_entropy=True), static_argnames=())
    packed = stats(m.params, jnp.asarray(tokens), segment_ids=jnp.asarray(segments))
    for i, seq in enumerate(seqs):
        alone = stats(m.params, jnp.asarray(seq[None]))
        where = segments[0] == i + 1
        np.testing.assert_allclose(packed.logprobs[0][where], alone.logprobs[0], atol=1e-5)
        np.testing.assert_allclose(packed.entropy[0][where][1:], alone.entropy[0][1:],
                                   atol=1e-5)
