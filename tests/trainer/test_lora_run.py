"""LoRA in the trainer (`model.lora.rank` > 0): the update trains the adapters alone (the base,
which is π_ref, is bitwise unchanged and has no second copy; the optimizer state is the
adapters'), and a `smoke` run matches on the (2, 2, 2) mesh and resumes bitwise, with adapter
dropout too (gradient passes only)."""

import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import config, models
from ibpo_jax.models import lora
from ibpo_jax.trainer import loop, packing, rl_step, step
from ibpo_jax.trainer.state import init_state, make_optimizer
from tests.models.test_lora import _random_b
from tests.trainer.knob_harness import EXACT, ONE, run_match_mesh_resume, smoke_cfg
from tests.trainer.test_step import (
    ARCH,
    GROUP0,
    GROUP1,
    REWARDS0,
    REWARDS1,
    _credit,
    _plan,
    _rollout,
)

LORA = {"model.lora.rank": 4, "model.lora.alpha": 8.0, "model.lora.targets": "q,v,o,up,down"}


def _host(tree):
    return jax.tree.map(lambda x: np.array(jax.device_get(x)), tree)


@pytest.mark.usefixtures("one_device")
def test_update_changes_only_the_adapters(smoke_data_dir, tmp_path):
    cfg = smoke_cfg(smoke_data_dir, {**LORA, **ONE})
    trainer = loop.Trainer(cfg, tmp_path)
    try:
        base, before = _host(trainer.parts.base.params), _host(trainer.state.params)
        assert len(jax.tree.leaves(before)) == 2 * 5 * cfg.model.tiny.num_hidden_layers
        d, f = cfg.model.tiny.hidden_size, cfg.model.tiny.intermediate_size
        assert before["layers_0"]["mlp"]["down_proj_lora_a"].shape == (f, 4)
        assert before["layers_0"]["mlp"]["down_proj_lora_b"].shape == (4, d)
        moments = [x for x in jax.tree.leaves(trainer.state.opt_state) if np.ndim(x)]
        assert sum(np.size(x) for x in moments) == 2 * sum(x.size for x in
                                                           jax.tree.leaves(before))
        # The step is a function over the run's frozen parts and its state (rl_step.py).
        with pytest.raises(dataclasses.FrozenInstanceError):
            trainer.parts.spec = None
        out = rl_step.rl_step(trainer.parts, trainer.state, 0.0, 1)
        assert out.budget == out.metrics["budget_trajectories"] == cfg.rows_per_step
        after = _host(out.state.params)
        jax.tree.map(np.testing.assert_array_equal, _host(trainer.parts.base.params), base)
        for path, x in jax.tree_util.tree_leaves_with_path(after):
            old = before
            for k in path:
                old = old[k.key]
            # B moves; A's gradient x^T (dL/dh) B^T is 0 while B = 0 (one update per step in
            # smoke, no weight decay), so A moves from the second step on
            moved = not np.array_equal(x, old)
            assert moved == path[-1].key.endswith(lora.B), jax.tree_util.keystr(path)
    finally:
        trainer.close()


@pytest.mark.usefixtures("one_device")
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_lora_run_matches_the_mesh_and_resumes_bitwise(smoke_data_dir, tmp_path, dropout):
    # dropout: the masks are functions of the step's key alone, drawn at global shapes
    one = run_match_mesh_resume(smoke_data_dir, tmp_path, {**LORA, "model.lora.dropout": dropout},
                                exact=EXACT + ("reward_mean",))
    # π_ref is the base with the adapters off: KL 0 while B = 0 (step 1), then the adapters
    # move the policy off it (were π_ref the adapted policy, it would stay 0)
    # (measured on two smoke bases: 0.0 at step 1, then 2e-8 to 6e-7)
    kl = [r["kl"] for r in one[1:]]
    assert abs(kl[0]) < 1e-9 and min(kl[1:]) > 1e-9, kl
    # dropout: π_old is a pass without it, so the ratio leaves 1 once B moved (from step 2)
    ratio = [r["ratio_max"] for r in one[2:]]
    assert min(ratio) > 1 if dropout else ratio == [1.0] * 3, ratio

    # The export is the base with the adapters folded in: the targets' weights moved off the
    # base's, the others are the base's bit for bit; the PEFT adapter beside it.
    from safetensors.numpy import load_file

    got = load_file(str(tmp_path / "one" / "hf_final" / "model.safetensors"))
    # the run's own base (other tests warm-start other bases into the shared data dir)
    source = json.loads((tmp_path / "one" / "base.json").read_text())["source"]
    (base_file,) = Path(smoke_data_dir).glob(f"warm_start/{source}/model.safetensors")
    base = load_file(str(base_file))
    assert got.keys() == base.keys()
    for name, target in (("self_attn.q_proj", True), ("mlp.up_proj", True),
                         ("self_attn.k_proj", False), ("mlp.gate_proj", False)):
        key = f"model.layers.0.{name}.weight"
        assert np.array_equal(got[key], base[key]) != target, key
    peft = load_file(str(tmp_path / "one" / "hf_final" / "peft_adapter" /
                         "adapter_model.safetensors"))
    assert len(peft) == 2 * 5 * 2  # (A, B) x 5 targets x 2 layers


def _dropout_update(rate, minibatches=1):
    """`step.update` of a tiny LoRA policy (adapters with B drawn, on q, v, o, up, down) with
    adapter dropout `rate`: (spec, π_old's up-front log-probs, update key -> (new adapters,
    metrics))."""
    cfg = config.load("configs/ibpo_grpo.py:smoke", [
        (k, str(v)) for k, v in {**LORA, "model.lora.dropout": rate,
                                 "optim.minibatches": minibatches}.items()])
    options = models.make_options(jnp.float32, lora_rank=4, lora_alpha=8.0, lora_dropout=rate)
    spec = step.StepSpec.from_config(cfg, ARCH, options)
    base = models.init(ARCH, jax.random.key(0)).params
    ad = _random_b(lora.init(base, rank=4, targets=lora.parse_targets(LORA["model.lora.targets"]),
                             key=jax.random.key(1)), jax.random.key(2))
    optimizer = make_optimizer(cfg.optim, total_updates=10)
    rollout = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1])
    cred, _ = _credit(spec, rollout)
    plan = packing.place(_plan(spec, rollout), jnp.asarray)
    state = init_state(ad, optimizer)
    old = step.prepare_batch(spec, state, base, rollout, cred, plan)[0].old_logp
    fn = jax.jit(functools.partial(step.update, spec, optimizer))
    return spec, old, lambda key: fn(state, base, rollout, cred, jax.random.key(key), plan)


def test_dropout_acts_in_the_gradient_passes_only():
    """π_old's pass has no dropout (the same log-probs at p = 0.5 as at p = 0, bitwise), nor
    have the on-policy diagnostics; the gradient passes have it (another update, replayed by
    the same key), so the first update's ratio is not 1."""
    # several updates per rollout: π_old's pass up front, in the same chunks at p = 0 and 0.5
    spec0, old0, _ = _dropout_update(0.0, minibatches=2)
    _, old5, _ = _dropout_update(0.5, minibatches=2)
    assert old0.shape == (8, 8) and float(jnp.abs(old0).max()) > 0
    np.testing.assert_array_equal(old5, old0)
    spec5, old5, update5 = _dropout_update(0.5)  # one update: π_old up front too, no dropout
    mask = step.response_mask(_rollout([*GROUP0, *GROUP1], [0.0] * 8).response_len, 8)
    np.testing.assert_allclose(np.where(mask, old5, 0), np.where(mask, old0, 0), atol=1e-5)
    spec0, _, update0 = _dropout_update(0.0)
    assert not spec5.single_update
    assert spec0.single_update  # π_old: the gradient pass itself
    (p0, m0), (p5, m5) = update0(1), update5(1)
    for key in ("entropy", "logprob_mismatch", "cancellation_residual"):
        assert float(m5[key]) == pytest.approx(float(m0[key]), rel=1e-5, abs=1e-7), key
    assert float(m0["ratio_max"]) == 1.0 and float(m5["ratio_max"]) > 1.0
    diff = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(p0.params),
                                                            jax.tree.leaves(p5.params)))
    assert diff > 1e-6
    jax.tree.map(np.testing.assert_array_equal, update5(1)[0].params, p5.params)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(update5(2)[0].params),
                                                        jax.tree.leaves(p5.params)))
