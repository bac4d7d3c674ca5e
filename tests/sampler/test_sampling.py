"""The KV-cache sampler against HF `generate` and against recomputation with a forward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ibpo_jax import models
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import sampling
from tests.models.hf_helpers import hf_model, left_padded_batch, saved

N = 24  # new tokens
LENGTHS = (7, 3, 5, 1)

_logprobs = jax.jit(models.token_logprobs, static_argnums=(0, 1),
                    static_argnames=("temperature",))


@pytest.fixture(scope="module")
def hf_and_path(tmp_path_factory):
    hf = hf_model(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    return hf, saved(hf, tmp_path_factory.mktemp("m"))


@pytest.fixture(scope="module")
def model(hf_and_path):
    return models.load_hf(hf_and_path[1])


@pytest.fixture(scope="module")
def prompts():
    tokens, mask = left_padded_batch(np.random.default_rng(0), LENGTHS, vocab=128)
    return tokens, mask, np.asarray(LENGTHS)


@pytest.fixture(scope="module")
def greedy(model, prompts):
    tokens, _, lens = prompts
    return sampling.generate(model, tokens, lens, max_new_tokens=N, temperature=0.0,
                             rng=jax.random.key(0))


def _recomputed_logprobs(m, prompts, lens, out, num_samples=1, temperature=1.0):
    """Log-probs of the generated tokens from one forward pass over prompt + generation."""
    p = prompts.shape[1]
    prompt_mask = np.arange(p)[None] >= p - lens[:, None]
    full = np.concatenate([np.repeat(prompts, num_samples, 0), np.asarray(out.tokens)], 1)
    mask = np.concatenate([np.repeat(prompt_mask, num_samples, 0),
                           np.arange(out.tokens.shape[1])[None] < np.asarray(out.lengths)[:, None]],
                          1)
    lp = _logprobs(m.config, m.options, m.params, jnp.asarray(full), jnp.asarray(mask),
                   temperature=temperature).logprobs
    return np.asarray(lp)[:, p:]


def test_greedy_equals_hf_generate_token_for_token(hf_and_path, prompts, greedy):
    hf, _ = hf_and_path
    tokens, mask, _ = prompts
    with torch.no_grad():
        ref = hf.generate(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask),
                          max_new_tokens=N, do_sample=False, pad_token_id=0, eos_token_id=None)
    np.testing.assert_array_equal(np.asarray(greedy.tokens), ref[:, tokens.shape[1]:].numpy())
    np.testing.assert_array_equal(greedy.lengths, N)


def test_greedy_across_three_cache_widths_equals_hf_generate(hf_and_path, prompts):
    """40 new tokens: the row cache grows 16 -> 32 -> 39 slots between decode segments
    (stacked layers, so the stacked cache grows too); greedy output still equals HF's."""
    hf, path = hf_and_path
    tokens, mask, lens = prompts
    out = sampling.generate(models.load_hf(path, scan_layers=True), tokens, lens,
                            max_new_tokens=40, temperature=0.0, rng=jax.random.key(0))
    with torch.no_grad():
        ref = hf.generate(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask),
                          max_new_tokens=40, do_sample=False, pad_token_id=0, eos_token_id=None)
    np.testing.assert_array_equal(np.asarray(out.tokens), ref[:, tokens.shape[1]:].numpy())


def test_rows_all_done_at_the_first_token_skip_the_later_segments(model, prompts):
    tokens, _, lens = prompts
    out = sampling.generate(model, tokens, lens, max_new_tokens=N, temperature=1.0,
                            rng=jax.random.key(4), eos_ids=tuple(range(128)), pad_id=0)
    np.testing.assert_array_equal(out.lengths, 1)
    assert (np.asarray(out.tokens)[:, 1:] == 0).all()
    assert (np.asarray(out.logprobs)[:, 0] < 0).all() and not np.asarray(out.logprobs)[:, 1:].any()


def test_greedy_logprobs_equal_a_forward_pass(model, prompts, greedy):
    tokens, _, lens = prompts
    ref = _recomputed_logprobs(model, tokens, lens, greedy)
    np.testing.assert_allclose(greedy.logprobs, ref, atol=1e-4)
    assert (np.asarray(greedy.logprobs) < 0).all()


def test_scanned_layers_sample_the_same(hf_and_path, prompts, greedy):
    tokens, _, lens = prompts
    m = models.load_hf(hf_and_path[1], scan_layers=True)
    out = sampling.generate(m, tokens, lens, max_new_tokens=N, temperature=0.0,
                            rng=jax.random.key(0))
    np.testing.assert_array_equal(out.tokens, greedy.tokens)
    np.testing.assert_allclose(out.logprobs, greedy.logprobs, atol=1e-5)


def test_bf16_scanned_layers_sample_like_a_bf16_forward_pass(hf_and_path, prompts):
    """The paper presets' setting: bf16 compute with nn.scan over layers. Decode attention
    must hand back the compute dtype (the scan carry), and the sampler's log-probs must be
    those of a bf16 forward pass, up to bf16 rounding."""
    tokens, _, lens = prompts
    m = models.load_hf(hf_and_path[1], dtype=jnp.bfloat16, param_dtype=jnp.float32,
                       scan_layers=True)
    out = sampling.generate(m, tokens, lens, max_new_tokens=N, temperature=1.0,
                            rng=jax.random.key(3))
    assert np.isfinite(np.asarray(out.logprobs)).all()
    again = _recomputed_logprobs(m, tokens, lens, out)
    np.testing.assert_allclose(out.logprobs, again, atol=0.1)


def test_num_samples_share_the_prompt_and_are_prompt_major(model, prompts):
    tokens, _, lens = prompts
    out = sampling.generate(model, tokens, lens, max_new_tokens=N, temperature=0.7,
                            rng=jax.random.key(3), num_samples=3)
    assert out.tokens.shape == (12, N) and out.logprobs.shape == (12, N)
    # Row b*3 + r continues prompt b: its log-probs recomputed on prompt b agree.
    ref = _recomputed_logprobs(model, tokens, lens, out, num_samples=3, temperature=0.7)
    np.testing.assert_allclose(out.logprobs, ref, atol=1e-4)
    rows = np.asarray(out.tokens)
    assert len({tuple(r) for r in rows}) == 12  # the samples differ


def test_entropy_is_the_policy_entropy_at_temperature_one_along_the_response(model, prompts):
    # Sampled at temperature 0.7 with top-k: each row's sum is still Σ_t H(softmax(logits_t)) of
    # the untempered, unfiltered policy over its own tokens, as one forward pass recomputes it.
    tokens, _, lens = prompts
    out = sampling.generate(model, tokens, lens, max_new_tokens=N, temperature=0.7, top_k=20,
                            rng=jax.random.key(5), num_samples=2)
    p = tokens.shape[1]
    prompt_mask = np.arange(p)[None] >= p - lens[:, None]
    full = np.concatenate([np.repeat(tokens, 2, 0), np.asarray(out.tokens)], 1)
    live = np.arange(N)[None] < np.asarray(out.lengths)[:, None]
    mask = np.concatenate([np.repeat(prompt_mask, 2, 0), live], 1)
    ent = models.token_logprobs(model.config, model.options, model.params, jnp.asarray(full),
                                jnp.asarray(mask), return_entropy=True).entropy
    want = np.where(live, np.asarray(ent)[:, p:], 0.0).sum(1)
    assert want.min() > 0.1  # a random model is far from deterministic
    np.testing.assert_allclose(out.entropy, want, rtol=1e-4)


def test_greedy_samples_of_one_prompt_are_identical(model, prompts, greedy):
    tokens, _, lens = prompts
    out = sampling.generate(model, tokens, lens, max_new_tokens=N, temperature=0.0,
                            rng=jax.random.key(1), num_samples=2)
    np.testing.assert_array_equal(out.tokens, np.repeat(np.asarray(greedy.tokens), 2, 0))


def test_rows_stop_at_their_first_eos(model, prompts, greedy):
    tokens, _, lens = prompts
    ref = np.asarray(greedy.tokens)
    eos = int(ref[0, 5])  # a token row 0 emits at step 5
    out = sampling.generate(model, tokens, lens, max_new_tokens=N, temperature=0.0,
                            rng=jax.random.key(0), eos_ids=(eos, 127), pad_id=0)
    got, lengths, lp = (np.asarray(a) for a in out[:3])
    for b in range(len(LENGTHS)):
        hits = np.flatnonzero(np.isin(ref[b], (eos, 127)))
        n = hits[0] + 1 if hits.size else N
        assert lengths[b] == n
        np.testing.assert_array_equal(got[b, :n], ref[b, :n])  # EOS token included
        assert (got[b, n:] == 0).all() and (lp[b, n:] == 0).all()
        np.testing.assert_allclose(lp[b, :n], np.asarray(greedy.logprobs)[b, :n], atol=1e-5)
    assert lengths[0] == 6


def test_sampling_is_deterministic_per_key(model, prompts):
    tokens, _, lens = prompts
    run = lambda key: sampling.generate(model, tokens, lens, max_new_tokens=N,  # noqa: E731
                                        temperature=1.0, top_k=20, rng=jax.random.key(key))
    a, b, c = run(5), run(5), run(6)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert (np.asarray(a.tokens) != np.asarray(c.tokens)).any()
    # The log-probs are those of the renormalized top-20 distribution, recomputed here from
    # a forward pass over prompt + sample.
    p = tokens.shape[1]
    prompt_mask = np.arange(p)[None] >= p - lens[:, None]
    full = np.concatenate([tokens, np.asarray(a.tokens)], 1)
    logits = np.asarray(model(full, np.concatenate([prompt_mask, np.ones((4, N), bool)], 1)))
    logits = logits[:, p - 1:-1]  # the logits each generated token was drawn from
    kth = np.sort(logits, -1)[..., -20][..., None]
    top = np.where(logits >= kth, logits, -np.inf)
    ref = np.take_along_axis(jax.nn.log_softmax(top, -1), np.asarray(a.tokens)[..., None], -1)
    np.testing.assert_allclose(a.logprobs, ref[..., 0], atol=1e-4)


def test_top_k_one_is_greedy(model, prompts, greedy):
    tokens, _, lens = prompts
    out = sampling.generate(model, tokens, lens, max_new_tokens=N, temperature=1.3, top_k=1,
                            rng=jax.random.key(2))
    np.testing.assert_array_equal(out.tokens, greedy.tokens)
    np.testing.assert_allclose(out.logprobs, 0.0, atol=1e-6)  # a one-token distribution


def test_sharded_generation_equals_single_device(model, prompts, greedy):
    tokens, _, lens = prompts
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    m = models.Qwen3LM(model.config, model.options, models.place_params(model.params, mesh),
                       mesh)
    out = sampling.generate(m, tokens, lens, max_new_tokens=N, temperature=0.0,
                            rng=jax.random.key(0))
    np.testing.assert_array_equal(out.tokens, greedy.tokens)
    np.testing.assert_allclose(out.logprobs, greedy.logprobs, atol=1e-5)


def test_filters_on_hand_computed_logits():
    logits = jnp.log(jnp.array([[0.1, 0.4, 0.2, 0.3]]))
    keep = lambda x: np.isfinite(np.asarray(x))[0].tolist()  # noqa: E731
    assert keep(sampling.TopK(2)(logits)) == [False, True, False, True]
    # mass before each token in sorted order: 0 (0.4), 0.4 (0.3), 0.7 (0.2), 0.9 (0.1)
    assert keep(sampling.TopP(0.7)(logits)) == [False, True, False, True]
    assert keep(sampling.TopP(0.71)(logits)) == [False, True, True, True]
    assert keep(sampling.TopP(0.05)(logits)) == [False, True, False, False]


def test_inverse_cdf_sampler_has_the_right_distribution():
    probs = np.zeros(300)  # spans three 128-token blocks; most tokens impossible
    probs[[3, 130, 131, 299]] = [0.1, 0.2, 0.3, 0.4]
    x = jnp.log(jnp.asarray(np.tile(probs, (40_000, 1)), jnp.float32))
    tokens, logp = jax.jit(sampling.sample_inverse_cdf)(x, jax.random.key(0))
    counts = np.bincount(np.asarray(tokens), minlength=300)
    assert counts.sum() == counts[[3, 130, 131, 299]].sum()  # never a zero-probability token
    freq = counts[[3, 130, 131, 299]] / 40_000
    assert np.abs(freq - [0.1, 0.2, 0.3, 0.4]).max() < 0.01  # ~4 standard errors
    np.testing.assert_allclose(np.asarray(logp), np.log(probs[np.asarray(tokens)]), atol=1e-5)


def test_inverse_cdf_never_returns_a_filtered_token_at_rounding_boundaries():
    """At a block boundary the float32 sums of the two levels can disagree by an ulp (block
    cdf - block mass > previous block's cdf); a uniform landing in between must not pick the
    block's first token when it is filtered out. (Picking "first token with cdf + before >= u"
    returned the -inf token for row 2 of this draw.)"""
    rng = np.random.default_rng(0)
    xs = (rng.normal(size=(16, 256)) * 3).astype(np.float32)
    xs[:, 128] = -np.inf  # the first token of block 1 is filtered out (top-k / top-p)
    rows, uniforms = [], []
    for x in xs:  # every float32 uniform within 300 ulps of the block boundary
        p = np.exp(x - x.max())
        center = np.float32(1.0 - p[:128].sum() / p.sum())
        up, down = center.copy(), center.copy()
        sweep = [center]
        for _ in range(300):
            up, down = np.nextafter(up, np.float32(1)), np.nextafter(down, np.float32(0))
            sweep += [up, down]
        rows += [x] * len(sweep)
        uniforms += sweep
    tokens, logp = jax.jit(sampling.inverse_cdf)(jnp.asarray(np.stack(rows)),
                                                 jnp.asarray(np.array(uniforms)[:, None]))
    assert np.isfinite(np.asarray(logp)).all()
    assert 128 not in set(np.asarray(tokens).tolist())
    assert {0, 1} <= set((np.asarray(tokens) // 128).tolist())  # both sides of the boundary


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(top_k=10**6), "top_k=1000000 exceeds the vocabulary"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(num_samples=0), "num_samples"),
    (dict(prompt_lens=np.array([0, 3, 5, 1])), "prompt_lens"),
    (dict(prompt_lens=np.array([8, 3, 5, 1])), "prompt_lens"),
    (dict(prompt_lens=np.array([7, 3])), "prompt_lens shape"),
])
def test_bad_arguments_raise(model, prompts, kwargs, match):
    tokens, _, lens = prompts
    args = dict(max_new_tokens=4, temperature=1.0, rng=jax.random.key(0), prompt_lens=lens)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        sampling.generate(model, tokens, args.pop("prompt_lens"), **args)
