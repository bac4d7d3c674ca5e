"""Packing plans and the packed layout (trainer/packing.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import models
from ibpo_jax.trainer import packing


def _random_rows(rng, n, p, r):
    prompt_len = rng.integers(1, p + 1, n)
    response_len = rng.integers(0, r + 1, n)
    prompt = np.zeros((n, p), np.int32)
    response = np.zeros((n, r), np.int32)
    for i in range(n):
        prompt[i, p - prompt_len[i]:] = rng.integers(3, 50, prompt_len[i])
        response[i, :response_len[i]] = rng.integers(3, 50, response_len[i])
    return prompt, prompt_len.astype(np.int32), response, response_len.astype(np.int32)


@pytest.mark.parametrize("seed", range(5))
def test_first_fit_places_every_row_once_without_overlap(seed):
    rng = np.random.default_rng(seed)
    n, p, r = 64, 10, 30
    _, prompt_len, _, response_len = _random_rows(rng, n, p, r)
    plan = packing.first_fit(prompt_len, response_len, p + r, multiple=4)
    lengths = prompt_len + response_len
    assert plan.rows % 4 == 0 or plan.rows == n
    assert plan.bin.max() < plan.rows
    occupied = np.zeros((plan.rows, p + r), int)
    for i in range(n):
        occupied[plan.bin[i], plan.start[i]:plan.start[i] + lengths[i]] += 1
        assert plan.start[i] + lengths[i] <= p + r
    assert occupied.max() <= 1  # no two rows share a column
    assert occupied.sum() == lengths.sum()
    # Rounded up to a multiple of 4 * ceil(64 / 32) = 8 rows: at most 7 empty packed rows.
    assert plan.rows - (occupied.sum(1) > 0).sum() < 8


def test_first_fit_rejects_rows_that_cannot_split():
    with pytest.raises(ValueError, match="multiples of 4"):
        packing.first_fit(np.ones(6), np.ones(6), 8, multiple=4)
    with pytest.raises(ValueError, match="does not fit"):
        packing.first_fit(np.full(4, 5), np.full(4, 5), 8, multiple=2)


@pytest.mark.parametrize("kind", ["identity", "first_fit"])
def test_pack_then_unpack_recovers_each_response(kind):
    rng = np.random.default_rng(1)
    n, p, r = 16, 6, 9
    prompt, prompt_len, response, response_len = _random_rows(rng, n, p, r)
    plan = (packing.identity(prompt_len, p, 4) if kind == "identity"
            else packing.first_fit(prompt_len, response_len, p + r, multiple=2))
    plan = packing.place(plan, jnp.asarray)
    tokens, segments, first = packing.pack(plan, *map(jnp.asarray, (prompt, prompt_len,
                                                                   response, response_len)))
    assert tokens.shape == (plan.rows, p + r)
    local = packing.local_rows(jnp.arange(plan.rows), plan.bin, plan.rows)
    got = np.asarray(packing.unpack(tokens, local, first, r))
    seg = np.asarray(packing.unpack(segments, local, first, r))
    prompts = np.asarray(packing.unpack(tokens, local, first - prompt_len, p))
    for i in range(n):
        np.testing.assert_array_equal(got[i, :response_len[i]], response[i, :response_len[i]])
        assert (seg[i, :response_len[i]] == i + 1).all()
        np.testing.assert_array_equal(prompts[i, :prompt_len[i]], prompt[i, p - prompt_len[i]:])
    if kind == "identity":  # the rollout's own layout
        np.testing.assert_array_equal(tokens * (segments > 0),
                                      np.concatenate([prompt, response], 1) * (segments > 0))
    # A chunk of packed rows: rollout rows elsewhere read 0.
    chunk = jnp.arange(0, plan.rows, 2)
    local = packing.local_rows(chunk, plan.bin, plan.rows)
    inside = np.isin(np.asarray(plan.bin), np.asarray(chunk))
    np.testing.assert_array_equal(np.asarray(local) >= 0, inside)
    part = np.asarray(packing.unpack(tokens[chunk], local, first, r))
    assert (part[~inside] == 0).all()
    real = np.arange(r)[None] < response_len[:, None]  # past a row's length: other rows' data
    np.testing.assert_array_equal(np.where(real, part, 0)[inside], np.where(real, got, 0)[inside])


def test_packed_token_logprobs_equal_each_row_alone():
    """The model on packed rows (segment ids) gives every token the log-prob it gets alone."""
    arch = models.Qwen3Config(vocab_size=50, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=8, rope_theta=10_000.0)
    m = models.init(arch, jax.random.key(0))
    rng = np.random.default_rng(2)
    n, p, r = 8, 5, 7
    prompt, prompt_len, response, response_len = _random_rows(rng, n, p, r)
    plan = packing.place(packing.first_fit(prompt_len, response_len, p + r, multiple=1),
                         jnp.asarray)
    assert plan.rows < n
    tokens, segments, first = packing.pack(plan, *map(jnp.asarray, (prompt, prompt_len,
                                                                   response, response_len)))
    packed = models.token_logprobs(arch, m.options, m.params, tokens, segment_ids=segments,
                                   return_entropy=True)
    local = packing.local_rows(jnp.arange(plan.rows), plan.bin, plan.rows)
    lp = np.asarray(packing.unpack(packed.logprobs, local, first, r))
    ent = np.asarray(packing.unpack(packed.entropy, local, first, r))
    alone = models.token_logprobs(arch, m.options, m.params, jnp.asarray(
        np.concatenate([prompt, response], 1)), jnp.asarray(np.concatenate(
            [np.arange(p)[None] >= (p - prompt_len)[:, None],
             np.arange(r)[None] < response_len[:, None]], 1)), return_entropy=True)
    for i in range(n):
        k = response_len[i]
        np.testing.assert_allclose(lp[i, :k], alone.logprobs[i, p:p + k], atol=1e-5)
        np.testing.assert_allclose(ent[i, :k], alone.entropy[i, p:p + k], atol=1e-5)
    with pytest.raises(ValueError, match="not both"):
        models.token_logprobs(arch, m.options, m.params, tokens, segments > 0,
                              segment_ids=segments)
