"""The presets start from the bases committed in experiments/warm_starts/ (trainer/policy.py)."""

import hashlib
import json

import pytest

from ibpo_jax import config
from ibpo_jax.trainer import loop, policy


@pytest.mark.parametrize("spec", ["configs/gspo.py:arith_tiny", "configs/ibpo_gspo.py:arith_long",
                                  "configs/score_grpo.py:arith_tiny"])
def test_each_preset_finds_its_committed_base(spec, tmp_path, monkeypatch):
    """A config change that alters a preset's warm-start key would silently warm-start a new,
    host-dependent base: the committed one must still match."""
    monkeypatch.setenv("IBPO_DATA_DIR", str(tmp_path))  # not the user's cache
    cfg = config.load(spec, [])
    path = policy.warm_start_dir(cfg, loop.build_tokenizer(cfg).vocab_size)
    assert path.parent == policy.COMMITTED and (path / "model.safetensors").exists(), path
    ident = policy.base_identity(cfg, loop.build_tokenizer(cfg).vocab_size)
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()[:16]
    assert ident == {"source": path.name, "sha256": digest}
    assert json.loads((path / "config.json").read_text())["hidden_size"] == 128


def test_a_config_without_a_committed_base_is_cached_in_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IBPO_DATA_DIR", str(tmp_path))
    cfg = config.load("configs/gspo.py:arith_tiny", [("warm_start.steps", "123")])
    path = policy.warm_start_dir(cfg, loop.build_tokenizer(cfg).vocab_size)
    assert path.parent == tmp_path / "warm_start" and path.name.startswith("arith_")
    cfg = config.load("configs/gspo.py:arith_tiny", [("warm_start.cache_dir", str(tmp_path))])
    assert policy.warm_start_dir(cfg, 50).parent == tmp_path
