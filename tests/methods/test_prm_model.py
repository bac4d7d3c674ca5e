"""The PRM of the PRM+GSPO baseline (methods/prm/model.py, DESIGN §7): step ends, features,
head fitting, scores."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import models
from ibpo_jax.data.tokenizer import CharTokenizer
from ibpo_jax.methods.prm import model as prm

TOK = CharTokenizer()
NL, EOS = TOK.encode("\n")[0], TOK.eos_id
ARCH = models.Qwen3Config(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, rope_theta=10_000.0)


OPTIONS = models.make_options(jnp.float32)


@functools.cache
def tiny_params():
    """Random weights of ARCH (norm scales near 1), filled on the host: `models.init` compiles
    its initializer, seconds on a loaded CPU."""
    rng = np.random.default_rng(0)
    return jax.tree_util.tree_map_with_path(
        lambda path, s: jnp.asarray(
            (1.0 if "norm" in jax.tree_util.keystr(path) else 0.0)
            + rng.normal(0.0, 0.1, s.shape), jnp.float32),
        models.abstract_params(ARCH, OPTIONS))


# Jitted: eager flax dispatches (and compiles) op by op, many times slower on CPU.
_final_hidden = jax.jit(models.final_hidden, static_argnums=(0, 1))
_forward = jax.jit(models.forward, static_argnums=(0, 1))
_features = jax.jit(prm.features, static_argnums=(0, 1))


def _rows(pairs, p, r, junk=7):
    """(prompt text, response text + EOS) pairs -> left-padded prompt [N, p], right-padded
    response [N, r] with junk (not padding) after each length, and both lengths."""
    prompt, response = np.zeros((len(pairs), p), np.int32), np.full((len(pairs), r), junk)
    plen, rlen = np.zeros(len(pairs), np.int32), np.zeros(len(pairs), np.int32)
    for i, (q, a) in enumerate(pairs):
        qt, at = TOK.encode(q), TOK.encode(a) + [EOS] if a else []
        prompt[i, p - len(qt):], response[i, :len(at)] = qt, at
        plen[i], rlen[i] = len(qt), len(at)
    return prompt, plen, response.astype(np.int32), rlen


def test_step_ends_hand_example():
    resp = np.array([[5, NL, 6, NL, 7, EOS, 9, 9],  # 3 steps: "5\n", "6\n", "7<eos>"
                     [5, NL, 6, NL, NL, 9, 9, 9],  # ends with a delimiter; "\n" alone a step
                     [5, 6, NL, 7, NL, 8, NL, 9],  # 4 steps (last cut short), K = 3 kept
                     [NL, NL, NL, 9, 9, 9, 9, 9],  # empty: no step, junk delimiters ignored
                     [5, 6, 9, 9, 9, 9, 9, 9]])  # one step, no delimiter
    pos, valid = prm.step_ends(resp, np.array([6, 5, 8, 0, 2]), TOK.is_delim, max_steps=3)
    np.testing.assert_array_equal(np.where(valid, pos, -1),
                                  [[1, 3, 5], [1, 3, 4], [2, 4, 6], [-1, -1, -1], [1, -1, -1]])
    assert pos.dtype == jnp.int32


def test_features_are_padding_invariant():
    """The feature of step k equals `final_hidden` at that token of the unpadded sequence."""
    params = tiny_params()
    pairs = [("Add 3.\n", "1+3=4\n4*2=8\nAnswer: 8"), ("Go.\n", "7\nAnswer: 7"),
             ("Start with 12.\n", "12-2=10")]
    # Leading spaces give every row the same real length (one compile for the unpadded rows)
    # while the rows' padding differs.
    total = 32
    pairs = [(" " * (total - len(q) - len(a) - 1) + q, a) for q, a in pairs]
    prompt, plen, resp, rlen = _rows(pairs, p=28, r=24)
    assert len(set(plen + rlen)) == 1 and len(set(plen)) == 3
    pos, valid = prm.step_ends(resp, rlen, TOK.is_delim, max_steps=4)
    feats = np.asarray(_features(ARCH, OPTIONS, params, jnp.asarray(prompt),
                                 jnp.asarray(plen), jnp.asarray(resp), jnp.asarray(rlen), pos))
    assert feats.shape == (3, 4, ARCH.hidden_size) and feats.dtype == np.float32
    seqs = jnp.asarray(np.stack([np.concatenate([prompt[i, 28 - plen[i]:], resp[i, :rlen[i]]])
                                 for i in range(3)]))
    alone = np.asarray(_final_hidden(ARCH, OPTIONS, params, seqs))  # [3, total, D]
    assert valid.sum() == 6
    for i, k in zip(*np.nonzero(np.asarray(valid))):
        np.testing.assert_allclose(feats[i, k], alone[i, plen[i] + pos[i, k]], atol=2e-5)
    # final_hidden is what the logits are computed from.
    np.testing.assert_allclose(alone @ np.asarray(params["lm_head"]),
                               np.asarray(_forward(ARCH, OPTIONS, params, seqs)), atol=1e-4)


@pytest.mark.parametrize("width", [0, 16])
def test_fit_head_learns_separable_features(width):
    rng = np.random.default_rng(0)
    n, k, d = 64, 4, 8
    feats = rng.normal(size=(n, k, d)).astype(np.float32) * 3.0 + 5.0  # off-centre, wide
    w = rng.normal(size=d)
    labels = ((feats - 5.0) @ w > 0).astype(np.float32)
    valid = rng.random((n, k)) < 0.8
    labels_junk = np.where(valid, labels, 1 - labels)  # invalid steps carry wrong labels
    head, metrics = prm.fit_head(jax.random.key(1), feats, labels_junk, valid, steps=300,
                                 lr=3e-2, width=width)
    assert metrics["loss"] < 0.5 * metrics["loss_init"]
    assert metrics["loss_init"] == pytest.approx(np.log(2), abs=1e-5)  # the head starts at 0.5
    assert metrics["accuracy"] > 0.9 and metrics["steps"] == valid.sum()
    hit = (np.asarray(prm.head_apply(head, feats)) > 0) == labels.astype(bool)
    assert hit[valid].mean() > 0.9
    bce = float(prm.bce_loss(head, feats, labels_junk, valid))
    assert bce == pytest.approx(metrics["loss"], rel=1e-5)


def test_bce_loss_soft_labels_by_hand():
    head = prm.init_head(jax.random.key(0), 2) | {"w": jnp.array([1.0, 0.0])}
    feats = jnp.array([[[2.0, 9.0], [-1.0, 9.0]]])
    labels, valid = jnp.array([[0.25, 1.0]]), jnp.array([[True, False]])
    p = 1 / (1 + np.exp(-2.0))
    expect = -(0.25 * np.log(p) + 0.75 * np.log(1 - p))
    assert float(prm.bce_loss(head, feats, labels, valid)) == pytest.approx(expect, rel=1e-5)


def test_process_reward_is_min_over_steps():
    params = tiny_params()
    pairs = [("Add 3.\n", "1+3=4\n4*2=8\nAnswer: 8"), ("Go.\n", "7"), ("Go.\n", "")]
    prompt, plen, resp, rlen = map(jnp.asarray, _rows(pairs, p=8, r=24))
    head = prm.init_head(jax.random.key(3), ARCH.hidden_size, width=8)
    head |= {"w2": jax.random.normal(jax.random.key(4), (8,)), "b": jnp.array(0.3)}
    score = jax.jit(prm.process_reward, static_argnums=(0, 1), static_argnames="max_steps")
    out = np.asarray(score(ARCH, OPTIONS, params, head, prompt, plen, resp, rlen,
                           jnp.asarray(TOK.is_delim), max_steps=4))
    pos, valid = prm.step_ends(resp, rlen, TOK.is_delim, max_steps=4)
    feats = _features(ARCH, OPTIONS, params, prompt, plen, resp, rlen, pos)
    prob = np.asarray(jax.nn.sigmoid(prm.head_apply(head, feats)))
    assert valid.sum(axis=1).tolist() == [3, 1, 0]
    np.testing.assert_allclose(out, [prob[0, :3].min(), prob[1, 0], 0.0], rtol=1e-5)
    assert len(set(np.round(prob[0, :3], 6))) == 3  # the min is a real choice


def test_label_accuracy_hand_example():
    prob = np.array([[0.9, 0.8, 0.2], [0.9, 0.3, 0.7], [0.6, 0.1, 0.0]])
    valid = np.array([[True, True, True], [True, True, True], [True, False, False]])
    first_wrong = np.array([-1, 1, 0])
    # Row 0: clean clean clean vs 1 1 0 -> 2 hits; row 1: clean wrong wrong vs 1 0 1 -> 2;
    # row 2: wrong vs 1 -> 0.
    assert prm.label_accuracy(prob, valid, first_wrong) == pytest.approx(4 / 7)
    assert prm.label_agreement(prob, valid, first_wrong) == (4, 7)
    assert np.isnan(prm.label_accuracy(prob, np.zeros_like(valid), first_wrong))
