"""The presets start from the bases committed in experiments/warm_starts/ (trainer/policy.py)."""

import hashlib
import json
import os
import shutil

import pytest

from ibpo_jax import config
from ibpo_jax.runtime import sharding
from ibpo_jax.trainer import policy, run_tasks


@pytest.mark.parametrize("spec", ["configs/gspo.py:arith_tiny", "configs/ibpo_gspo.py:arith_long",
                                  "configs/score_grpo.py:arith_tiny"])
def test_each_preset_finds_its_committed_base(spec, tmp_path, monkeypatch):
    """A config change that alters a preset's warm-start key would silently warm-start a new,
    host-dependent base: the committed one must still match."""
    monkeypatch.setenv("IBPO_DATA_DIR", str(tmp_path))  # not the user's cache
    cfg = config.load(spec, [])
    path = policy.warm_start_dir(cfg, run_tasks.build_tokenizer(cfg).vocab_size)
    assert path.parent == policy.COMMITTED and (path / "model.safetensors").exists(), path
    ident = policy.base_identity(cfg, run_tasks.build_tokenizer(cfg).vocab_size)
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()[:16]
    assert ident == {"source": path.name, "sha256": digest}
    assert json.loads((path / "config.json").read_text())["hidden_size"] == 128


def test_a_config_without_a_committed_base_is_cached_in_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IBPO_DATA_DIR", str(tmp_path))
    cfg = config.load("configs/gspo.py:arith_tiny", [("warm_start.steps", "123")])
    path = policy.warm_start_dir(cfg, run_tasks.build_tokenizer(cfg).vocab_size)
    assert path.parent == tmp_path / "warm_start" and path.name.startswith("arith_")
    cfg = config.load("configs/gspo.py:arith_tiny", [("warm_start.cache_dir", str(tmp_path))])
    assert policy.warm_start_dir(cfg, 50).parent == tmp_path


def _tiny_ws(tmp_path, search_path):
    """The smoke preset with a 2-step warm start (a key no committed base has), searched along
    `search_path`, cached in tmp_path/cache."""
    return config.load("configs/ibpo_gspo.py:smoke", [
        ("warm_start.steps", "2"), ("warm_start.warmup_steps", "1"),
        ("warm_start.batch_size", "4"), ("warm_start.cache_dir", str(tmp_path / "cache")),
        ("warm_start.search_path", search_path)])


def test_a_base_is_found_in_the_second_directory_of_the_search_path(tmp_path, monkeypatch):
    monkeypatch.setenv("IBPO_DATA_DIR", str(tmp_path / "data"))
    committed = config.load("configs/gspo.py:arith_tiny", [])
    vocab = run_tasks.build_tokenizer(committed).vocab_size
    source = policy.warm_start_dir(committed, vocab)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    shutil.copytree(source, second / source.name)
    cfg = config.load("configs/gspo.py:arith_tiny",
                      [("warm_start.search_path", f"{first}{os.pathsep}{second}")])
    assert policy.search_path(cfg) == [first, second, tmp_path / "data" / "warm_start"]
    assert policy.warm_start_dir(cfg, vocab) == second / source.name  # not the committed copy
    log = []
    base = policy.load_base(cfg, task=None, tokenizer=run_tasks.build_tokenizer(cfg),
                            mesh=sharding.make_mesh(data=-1), log=log.append)
    assert log == [f"base policy: cached warm start {second / source.name}"]
    assert base.config.hidden_size == 128
    with pytest.raises(config.ConfigError, match=r"config\.warm_start\.search_path: .*nowhere"):
        policy.warm_start_dir(config.load("configs/gspo.py:arith_tiny", [
            ("warm_start.search_path", str(tmp_path / "nowhere"))]), vocab)


def test_a_base_found_nowhere_is_warm_started_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IBPO_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "empty").mkdir()
    cfg = _tiny_ws(tmp_path, str(tmp_path / "empty"))
    tokenizer = run_tasks.build_tokenizer(cfg)
    path = policy.warm_start_dir(cfg, tokenizer.vocab_size)
    assert path.parent == tmp_path / "cache" and not path.exists()
    log = []
    task = run_tasks.build_task(cfg, tokenizer, cfg.task.name, cfg.task.path)
    base = policy.load_base(cfg, task=task, tokenizer=tokenizer,
                            mesh=sharding.make_mesh(data=-1), log=log.append)
    assert "running a supervised warm start" in log[0] and str(path) in log[0]
    assert (path / "model.safetensors").exists() and base.config.hidden_size == 64
    assert policy.warm_start_dir(cfg, tokenizer.vocab_size) == path  # found there next time
