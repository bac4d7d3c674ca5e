"""LoRA adapters (models/lora.py): B = 0 gives the base's logits bitwise; the adapted model
equals W + (alpha / r) A B folded into the weights, in our model and in HF transformers (the
merged export), and the PEFT tensors reproduce that merge."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ibpo_jax import models
from ibpo_jax.models import lora, qwen3
from ibpo_jax.runtime import sharding
from tests.models.hf_helpers import hf_logits, left_padded_batch

CFG = models.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, rope_theta=1000.0, initializer_range=0.2)


def _random_b(adapters, key):
    """Adapters with B drawn too (a trained adapter), so they change the model."""
    leaves, tree = jax.tree_util.tree_flatten_with_path(adapters)
    out = [jax.random.normal(jax.random.fold_in(key, i), x.shape, x.dtype) * 0.3
           if str(path[-1].key).endswith(lora.B) else x for i, (path, x) in enumerate(leaves)]
    return jax.tree_util.tree_unflatten(tree, out)


def _model(scan, **options):
    return models.init(CFG, jax.random.key(0), scan_layers=scan, lora_alpha=8.0, **options)


def test_targets_are_validated_with_the_valid_names_listed():
    assert lora.parse_targets(" q, v,down,q") == ("q", "v", "down")
    with pytest.raises(ValueError, match=r"\['qq', 'mlp'\]; valid: q, k, v, o, gate, up, down"):
        lora.parse_targets("q,qq,mlp")


@pytest.mark.parametrize("scan", [False, True])
def test_shapes_and_step0_logits_equal_the_base_bitwise(scan):
    m = _model(scan)
    ad = lora.init(m.params, rank=4, targets=("q", "o", "down"), key=jax.random.key(1))
    node = ad["layers"] if scan else ad["layers_1"]
    lead = (2,) if scan else ()
    assert sorted(node["attn"]) == ["o_proj_lora_a", "o_proj_lora_b", "q_proj_lora_a",
                                    "q_proj_lora_b"]
    assert node["attn"]["q_proj_lora_a"].shape == (*lead, 32, 4)  # [D, r]
    assert node["attn"]["q_proj_lora_b"].shape == (*lead, 4, 32)  # [r, N*H]
    assert node["attn"]["o_proj_lora_a"].shape == (*lead, 32, 4)  # [N*H, r]
    assert node["mlp"]["down_proj_lora_a"].shape == (*lead, 48, 4)  # [F, r]
    assert float(jnp.abs(node["mlp"]["down_proj_lora_a"]).max()) <= 1 / np.sqrt(48)
    assert not np.any(np.asarray(node["mlp"]["down_proj_lora_b"]))
    tokens = jax.random.randint(jax.random.key(2), (2, 7), 0, 64)
    base = models.forward(CFG, m.options, m.params, tokens)
    adapted = models.forward(CFG, m.options, lora.merge(m.params, ad), tokens)
    np.testing.assert_array_equal(np.asarray(adapted), np.asarray(base))
    changed = models.forward(CFG, m.options, lora.merge(m.params, _random_b(ad, jax.random.key(3))),
                             tokens)
    assert float(jnp.abs(changed - base).max()) > 1e-2


@pytest.mark.parametrize("scan", [False, True])
def test_adapted_model_equals_its_folded_weights(scan):
    m = _model(scan)
    ad = _random_b(lora.init(m.params, rank=3, targets=tuple(lora.TARGETS),
                             key=jax.random.key(1)), jax.random.key(2))
    merged = lora.merge(m.params, ad)
    folded = lora.fold(merged, 8.0)
    assert jax.tree.structure(folded) == jax.tree.structure(m.params)
    # by hand for one weight: o_proj [N, H, D] + (8 / 3) A [N*H, r] B [r, D]
    layer = (lambda t: t["layers"]["attn"]) if scan else (lambda t: t["layers_0"]["attn"])
    a, b, w = (np.asarray(layer(x)[k], np.float64) for x, k in (
        (ad, "o_proj_lora_a"), (ad, "o_proj_lora_b"), (m.params, "o_proj")))
    expect = w + (8.0 / 3) * np.matmul(a, b).reshape(w.shape)
    np.testing.assert_allclose(np.asarray(layer(folded)["o_proj"]), expect, rtol=1e-5, atol=1e-6)
    tokens = jax.random.randint(jax.random.key(4), (2, 9), 0, 64)
    np.testing.assert_allclose(models.forward(CFG, m.options, merged, tokens),
                               models.forward(CFG, m.options, folded, tokens), atol=2e-4)


def test_bf16_base_with_fp32_adapters_trains_the_adapters_only():
    m = _model(True, param_dtype=jnp.bfloat16)
    ad = lora.init(m.params, rank=2, targets=("v", "up"), key=jax.random.key(1))
    assert {x.dtype for x in jax.tree.leaves(m.params)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(ad)} == {jnp.dtype(jnp.float32)}
    tokens = jax.random.randint(jax.random.key(2), (2, 6), 0, 64)
    loss = lambda p: models.token_logprobs(CFG, m.options, lora.merge(m.params, p),
                                           tokens).logprobs.sum()
    grads = jax.grad(loss)(ad)
    assert jax.tree.structure(grads) == jax.tree.structure(ad)
    # B = 0: d/dA is 0, d/dB is not (the adapter's first update moves B)
    assert not np.any(np.asarray(grads["layers"]["attn"]["v_proj_lora_a"]))
    assert float(jnp.abs(grads["layers"]["mlp"]["up_proj_lora_b"]).max()) > 0


def test_adapters_shard_like_the_training_weights():
    spec = lambda name, nd: sharding.param_spec(("layers", "attn", name), nd, sharding.TRAINING)
    assert spec("q_proj_lora_a", 3) == jax.sharding.PartitionSpec(None, "fsdp", None)
    assert spec("q_proj_lora_b", 3) == jax.sharding.PartitionSpec(None, None, "fsdp")
    samp = sharding.param_spec(("layers_0", "mlp", "up_proj_lora_b"), 2, sharding.SAMPLING)
    assert samp == jax.sharding.PartitionSpec(None, None)


def test_merged_export_matches_in_transformers_and_peft_tensors_reproduce_it(tmp_path):
    m = _model(True)
    ad = _random_b(lora.init(m.params, rank=4, targets=("q", "k", "o", "gate", "down"),
                             key=jax.random.key(1)), jax.random.key(2))
    merged = lora.merge(m.params, ad)
    models.save_hf(models.Qwen3LM(CFG, m.options, lora.fold(merged, 8.0)), tmp_path / "hf")
    models.save_hf(models.Qwen3LM(CFG, m.options, m.params), tmp_path / "base")
    lora.save_peft(ad, tmp_path / "peft", alpha=8.0, dropout=0.05)
    import transformers
    from safetensors.numpy import load_file

    hf = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens, mask = left_padded_batch(np.random.default_rng(0), [7, 4], 64)
    ours = models.forward(CFG, m.options, merged, jnp.asarray(tokens), jnp.asarray(mask))
    np.testing.assert_allclose(hf_logits(hf, tokens, mask)[mask.astype(bool)],
                               np.asarray(ours)[mask.astype(bool)], atol=2e-4)
    # PEFT's merge, W + lora_alpha / r * B A, of the base checkpoint gives the merged one.
    base = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "base").state_dict()
    peft = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
    assert len(peft) == 2 * 5 * 2  # (A, B) x 5 modules x 2 layers
    for name, w in hf.state_dict().items():
        stem = "base_model.model." + name[:-len(".weight")]
        if stem + ".lora_A.weight" in peft:
            a, b = peft[stem + ".lora_A.weight"], peft[stem + ".lora_B.weight"]
            assert a.shape == (4, base[name].shape[1]) and b.shape == (base[name].shape[0], 4)
            want = base[name].numpy() + 8.0 / 4 * b @ a
            np.testing.assert_allclose(w.numpy(), want, rtol=1e-5, atol=1e-6)
        else:
            torch.testing.assert_close(w, base[name])
    conf = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert (conf["r"], conf["lora_alpha"], conf["peft_type"]) == (4, 8.0, "LORA")
    assert conf["lora_dropout"] == 0.05  # the run's, for training on in PEFT
    assert conf["target_modules"] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj"]


def test_dropout_masks_the_adapter_input_by_hand():
    """Inverted dropout (PEFT's `lora_dropout`): kept entries scaled by 1 / (1 - p), the others
    0, the keep mask Bernoulli(1 - p) of the key; the adapter's term of the dropped input."""
    x = jax.random.normal(jax.random.key(0), (6, 5))
    key, p = jax.random.key(7), 0.4
    got = np.asarray(lora.dropout(x, key=key, rate=p))
    keep = np.asarray(jax.random.bernoulli(key, 1 - p, x.shape))
    assert 0 < keep.sum() < keep.size  # both kinds of entries
    np.testing.assert_allclose(got, np.where(keep, np.asarray(x) / (1 - p), 0.0), rtol=1e-6)
    a = np.asarray(jax.random.normal(jax.random.key(1), (5, 3)), np.float64)
    b = np.asarray(jax.random.normal(jax.random.key(2), (3, 4)), np.float64)
    want = (8.0 / 3) * (np.where(keep, np.asarray(x, np.float64) / (1 - p), 0.0) @ a) @ b
    np.testing.assert_allclose(lora.delta(jnp.asarray(got), jnp.asarray(a, jnp.float32),
                                          jnp.asarray(b, jnp.float32), 8.0, jnp.float32),
                               want, rtol=1e-5, atol=1e-5)


def _mlp_with_down_adapter(rate):
    """An Mlp with an adapter on down_proj only (its output is linear in the adapter's input),
    its params, and an input [2, 3, D]."""
    opts = models.make_options(jnp.float32, lora_rank=3, lora_alpha=8.0, lora_dropout=rate)
    mlp = qwen3.Mlp(CFG, opts, sharding.TRAINING)
    k = lambda i, shape: jax.random.normal(jax.random.key(i), shape) * 0.3
    d, f = CFG.hidden_size, CFG.intermediate_size
    params = {"gate_proj": k(0, (d, f)), "up_proj": k(1, (d, f)), "down_proj": k(2, (f, d)),
              "down_proj_lora_a": k(3, (f, 3)), "down_proj_lora_b": k(4, (3, d))}
    return mlp, {"params": params}, k(5, (2, 3, d))


def test_dropout_is_unbiased_and_off_without_its_rng():
    mlp, variables, x = _mlp_with_down_adapter(0.5)
    plain = mlp.apply(variables, x)  # no rng: no dropout (sampler, π_old, evaluation)
    off, _, _ = _mlp_with_down_adapter(0.0)
    np.testing.assert_array_equal(plain, off.apply(variables, x))
    np.testing.assert_array_equal(plain, off.apply(variables, x, rngs={qwen3.DROPOUT_RNG:
                                                                        jax.random.key(0)}))
    keys = jax.random.split(jax.random.key(9), 4000)
    outs = jax.vmap(lambda k: mlp.apply(variables, x, rngs={qwen3.DROPOUT_RNG: k}))(keys)
    assert float(jnp.abs(outs[0] - plain).max()) > 1e-2  # one draw: dropout acts
    # E[out] = the no-dropout output (the adapter is linear in its dropped input): the mean of
    # 4000 draws within 4.5 standard errors, entry by entry
    sem = np.asarray(outs.std(0)) / np.sqrt(len(keys))
    err = np.abs(np.asarray(outs.mean(0) - plain))
    assert np.all(err <= 4.5 * sem + 1e-6), float((err / sem).max())
    assert float(sem.max()) < 0.05 * float(jnp.abs(plain).max())  # a check that could fail


def test_dropout_keys_are_per_layer_and_projection_and_replayable(monkeypatch):
    m = _model(False, lora_dropout=0.3)
    ad = _random_b(lora.init(m.params, rank=2, targets=tuple(lora.TARGETS),
                             key=jax.random.key(1)), jax.random.key(2))
    seen = []
    real = lora.dropout
    monkeypatch.setattr(lora, "dropout", lambda x, *, key, rate: (
        seen.append(np.asarray(jax.random.key_data(key)).tobytes()), real(x, key=key,
                                                                          rate=rate))[1])
    tokens = jax.random.randint(jax.random.key(3), (2, 6), 0, 64)
    run = lambda key: models.token_logprobs(CFG, m.options, lora.merge(m.params, ad), tokens,
                                            dropout_key=key).logprobs
    first = run(jax.random.key(5))
    keys_a = list(seen)
    assert len(keys_a) == 2 * 7 and len(set(keys_a)) == 14  # 7 projections x 2 layers
    np.testing.assert_array_equal(run(jax.random.key(5)), first)  # the same key: replayed
    assert seen[14:] == keys_a
    run(jax.random.key(6))
    assert not set(seen[28:]) & set(keys_a)  # another step's key: other masks
    assert float(jnp.abs(first - run(None)).max()) > 1e-3
    assert len(seen) == 42  # None: no dropout


def test_scanned_dropout_with_remat_replays_its_masks_in_the_backward():
    """Under `nn.scan` (a key per layer) and remat, the backward recomputes the forward with
    the same masks: loss and gradient equal the un-rematerialized model's."""
    tokens = jax.random.randint(jax.random.key(3), (2, 6), 0, 64)

    def loss_grad(remat):
        m = _model(True, lora_dropout=0.3, remat=remat)
        ad = _random_b(lora.init(m.params, rank=2, targets=("q", "v", "up", "down"),
                                 key=jax.random.key(1)), jax.random.key(2))
        f = lambda a, key: models.token_logprobs(CFG, m.options, lora.merge(m.params, a),
                                                 tokens, dropout_key=key).logprobs.sum()
        return jax.value_and_grad(f)(ad, jax.random.key(4)), f(ad, None)

    ((lo, g), nodrop), ((lr, gr), _) = loss_grad("none"), loss_grad("full")
    assert abs(float(lo - nodrop)) > 1e-3  # dropout acts under scan
    assert float(lr) == pytest.approx(float(lo), rel=1e-6)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(gr)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
