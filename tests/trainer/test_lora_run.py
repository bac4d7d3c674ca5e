"""LoRA in the trainer (`model.lora.rank` > 0): the update trains the adapters alone (the base,
which is π_ref, is bitwise unchanged and has no second copy; the optimizer state is the
adapters'), and a `smoke` run matches on the (2, 2, 2) mesh and resumes bitwise."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from ibpo_jax.models import lora
from ibpo_jax.trainer import loop
from tests.trainer.knob_harness import EXACT, ONE, run_match_mesh_resume, smoke_cfg

LORA = {"model.lora.rank": 4, "model.lora.alpha": 8.0, "model.lora.targets": "q,v,o,up,down"}


def _host(tree):
    return jax.tree.map(lambda x: np.array(jax.device_get(x)), tree)


@pytest.mark.usefixtures("one_device")
def test_update_changes_only_the_adapters(smoke_data_dir, tmp_path):
    cfg = smoke_cfg(smoke_data_dir, {**LORA, **ONE})
    trainer = loop.Trainer(cfg, tmp_path)
    try:
        base, before = _host(trainer.base.params), _host(trainer.state.params)
        assert len(jax.tree.leaves(before)) == 2 * 5 * cfg.model.tiny.num_hidden_layers
        d, f = cfg.model.tiny.hidden_size, cfg.model.tiny.intermediate_size
        assert before["layers_0"]["mlp"]["down_proj_lora_a"].shape == (f, 4)
        assert before["layers_0"]["mlp"]["down_proj_lora_b"].shape == (4, d)
        moments = [x for x in jax.tree.leaves(trainer.state.opt_state) if np.ndim(x)]
        assert sum(np.size(x) for x in moments) == 2 * sum(x.size for x in
                                                           jax.tree.leaves(before))
        trainer.rl_step(1)
        after = _host(trainer.state.params)
        jax.tree.map(np.testing.assert_array_equal, _host(trainer.base.params), base)
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
def test_lora_run_matches_the_mesh_and_resumes_bitwise(smoke_data_dir, tmp_path):
    one = run_match_mesh_resume(smoke_data_dir, tmp_path, LORA, exact=EXACT + ("reward_mean",))
    # π_ref is the base with the adapters off: KL 0 while B = 0 (step 1), then the adapters
    # move the policy off it (were π_ref the adapted policy, it would stay 0)
    # (measured on two smoke bases: 0.0 at step 1, then 2e-8 to 6e-7)
    kl = [r["kl"] for r in one[1:]]
    assert abs(kl[0]) < 1e-9 and min(kl[1:]) > 1e-9, kl

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
