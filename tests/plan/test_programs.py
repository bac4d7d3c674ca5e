"""`python -m ibpo_jax.plan --only=...`: a program compiled on its own has the figures it has
in the full plan. Its inputs carry the shardings their producers' compile chose, so those
producers compile too (`programs.FEEDS`): from a trace alone every input was replicated, and
`--only=decode` put qwen3_8b_math's decode at 140.3 GiB per device (the KV cache whole on each
of 8 devices) where the full plan has 67.4 GiB, and 14B's at 102.0 (its weight copy not split
over tensor). Checked on the smoke model on a (1, 4, 2) mesh: seconds."""

from __future__ import annotations

import jax
import pytest

from ibpo_jax import config, plan
from ibpo_jax.plan import programs

MESH = [("mesh.data", "1"), ("mesh.fsdp", "-1"), ("mesh.tensor", "2")]


@pytest.fixture(scope="module")
def plans():
    assert len(jax.devices()) >= 8, "tests/conftest.py asks for 8 CPU devices"
    cfg = config.load("configs/ibpo_gspo.py:smoke", MESH)
    return cfg, plan.plan_json(cfg, "h100", 8, only=("decode",)), plan.plan_json(cfg, "h100", 8)


def test_compiled_names_add_what_feeds_them():
    assert programs.compiled_names(None) is None
    always = ("sampling weights", "credit (φ)")
    assert programs.compiled_names(("decode",)) == (*always, "prefill", "decode")
    assert programs.compiled_names(("update", "prefill")) == (*always, "update", "prefill")


def test_only_decode_matches_the_full_plan(plans):
    _, only, full = plans
    rows = lambda out: {r["name"]: r for r in out["program_details"]}  # noqa: E731
    for name in ("sampling weights", "prefill", "decode: grow cache", "decode", "credit (φ)"):
        assert rows(only)[name] == rows(full)[name], name
    assert "update" not in rows(only) and "update" in rows(full)
    assert only["resident_bytes_per_device"] == full["resident_bytes_per_device"]
    assert only["flops_per_step"] == full["flops_per_step"]
    assert only["predicted_step_s"] == pytest.approx(full["predicted_step_s"], rel=1e-9)
    assert programs.ONLY is None  # a later plan or "auto" search compiles every program


def test_decode_state_is_split_like_the_sampler_splits_it(plans):
    """By hand, smoke (2 layers, 2 KV heads of 16, float32; 4 prompts of 64 tokens x G 4, 40
    new tokens: widest row cache 39 slots): per device 1 prompt of the 4 (data x fsdp = 4) and
    1 KV head of the 2 (tensor 2): row cache 4 rows x 39 slots, prompt cache 1 x 64 positions,
    2 layers x (k, v) x 16 x 4 bytes each. The rest of the state (tokens, log-probs, masks) is
    5,660 bytes whole. The sampler's copy splits every matrix over tensor and keeps the norms
    whole (2 layers x (64 + 64 + 16 + 16) + 64 = 384 weights); traced alone, all was whole."""
    cfg, only, _ = plans
    decode = next(r for r in only["program_details"] if r["name"] == "decode")
    copy = only["resident_bytes_per_device"]["sampling_copy"]
    kv = (4 * 39 + 1 * 64) * 2 * 2 * 16 * 4
    assert 0 <= decode["argument"] - copy - kv <= 5660, decode["argument"] - copy
    c, _, _ = programs.model_of(cfg)
    norms = 2 * (64 + 64 + 16 + 16) + 64
    assert copy == ((c.num_params() - norms) // 2 + norms) * 4 == 208_384
