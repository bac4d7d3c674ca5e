"""Qwen3Config <-> HF config.json, published presets, option validation."""

import json
import math

import jax
import jax.numpy as jnp
import pytest
import transformers

from ibpo_jax import models
from ibpo_jax.models import ArchitectureError, ModelOptions, Qwen3Config

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-5,
             rope_theta=5000.0, max_position_embeddings=300, tie_word_embeddings=True)


def test_from_transformers_saved_config_and_back(tmp_path):
    transformers.Qwen3Config(**SMALL).save_pretrained(tmp_path)  # writes rope_parameters
    cfg = Qwen3Config.from_hf(tmp_path)
    assert cfg == Qwen3Config(**SMALL)
    back = transformers.Qwen3Config(**cfg.to_hf_dict())
    for key, value in SMALL.items():
        if key != "rope_theta":
            assert getattr(back, key) == value, key
    assert back.rope_parameters["rope_theta"] == 5000.0
    assert cfg.num_groups == 2


def test_transformers_4_spelling_with_top_level_rope_theta(tmp_path):
    d = {**SMALL, "model_type": "qwen3", "hidden_act": "silu", "rope_scaling": None}
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert Qwen3Config.from_hf(tmp_path / "config.json") == Qwen3Config(**SMALL)
    # Absent or null head_dim / num_key_value_heads: what transformers' Qwen3Config assumes.
    for d2 in ({k: v for k, v in d.items() if k != "head_dim"},
               {**d, "num_key_value_heads": None}):
        cfg, hf = Qwen3Config.from_hf(d2), transformers.Qwen3Config(**d2)
        assert (cfg.head_dim, cfg.num_key_value_heads) == (hf.head_dim, hf.num_key_value_heads)
    with pytest.raises(ArchitectureError, match="num_attention_heads=4 is not a multiple of "
                       "num_key_value_heads=32"):  # HF's default of 32 kv heads does not fit
        Qwen3Config.from_hf({k: v for k, v in d.items() if k != "num_key_value_heads"})


@pytest.mark.parametrize("change, field", [
    ({"model_type": "llama"}, "model_type"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type"),
    ({"rope_theta": None}, "rope_theta"),
    ({"hidden_size": None}, "hidden_size"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"hidden_size": "64"}, "hidden_size"),
    ({"rms_norm_eps": "x"}, "rms_norm_eps"),
    ({"rope_theta": "abc"}, "rope_theta"),
])
def test_unsupported_or_broken_configs_name_the_field(change, field):
    with pytest.raises(ArchitectureError, match=field):
        Qwen3Config.from_hf({**SMALL, **change})


def test_missing_or_corrupt_config_file(tmp_path):
    with pytest.raises(ArchitectureError, match="no HF config"):
        Qwen3Config.from_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ArchitectureError, match="not valid JSON"):
        Qwen3Config.from_hf(tmp_path)


# Published totals / non-embedding counts of the Qwen3 model cards, in billions, and the
# precision they are quoted to.
PUBLISHED = {
    "qwen3-0.6b": (0.6, 0.44, 0.05, 0.005),
    "qwen3-1.7b": (1.7, 1.4, 0.05, 0.05),
    "qwen3-4b": (4.0, 3.6, 0.05, 0.05),
    "qwen3-8b": (8.2, 6.95, 0.05, 0.005),
    "qwen3-14b": (14.8, 13.2, 0.05, 0.05),
    "qwen3-32b": (32.8, 31.2, 0.05, 0.05),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_presets_have_the_published_parameter_counts(name):
    cfg = models.QWEN3_PRESETS[name]
    shapes = models.abstract_params(cfg, ModelOptions(scan_layers=True, param_dtype=jnp.bfloat16))
    total = sum(math.prod(s.shape) for s in jax.tree.leaves(shapes))  # nothing allocated
    assert total == cfg.num_params()
    embeddings = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    want_total, want_body, tol_total, tol_body = PUBLISHED[name]
    assert abs(total / 1e9 - want_total) <= tol_total
    assert abs((total - embeddings) / 1e9 - want_body) <= tol_body


def test_options_validation():
    opts = ModelOptions(dtype="bfloat16", param_dtype=jnp.float32)
    assert opts.dtype == jnp.bfloat16 and hash(opts) == hash(ModelOptions(dtype=jnp.bfloat16))
    with pytest.raises(ArchitectureError, match="remat"):
        ModelOptions(remat="everything")
    with pytest.raises(ArchitectureError, match="dtype"):
        ModelOptions(dtype=jnp.int32)
    assert ModelOptions().attention == "auto"
    with pytest.raises(ArchitectureError, match="attention='flash'"):
        ModelOptions(attention="flash")
    with pytest.raises(ArchitectureError, match="attention_block_kv"):
        ModelOptions(attention_block_kv=0)
