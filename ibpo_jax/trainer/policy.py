"""Where the base policy comes from: a local HF checkpoint, a cached warm start, or random.

For the embedded `arith` task there is no pretrained checkpoint, so the default config starts
from a supervised warm start on the task's reference solutions (`warm_start.run`), an HF
directory keyed by everything that determines it, looked up along a search path
(`warm_start.search_path`; by default the bases committed under experiments/warm_starts/, then
the cache); a base found nowhere is warm-started once into the cache, and later runs (any RL
seed or algorithm) reuse it. RL then starts from a policy with non-trivial accuracy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from ibpo_jax import models
from ibpo_jax.config import ConfigError, RunConfig
from ibpo_jax.trainer import warm_start


def model_options(cfg: RunConfig) -> dict[str, Any]:
    """`models.ModelOptions` fields of this run (a value head for PPO's critic)."""
    return dict(
        param_dtype=jnp.dtype(cfg.model.param_dtype),
        remat=cfg.model.remat,
        scan_layers=cfg.model.scan_layers,
        value_head=cfg.loss.name == "ppo",
        attention=cfg.model.attention,
        lora_rank=cfg.model.lora.rank,
        lora_alpha=cfg.model.lora.alpha,
        lora_dropout=cfg.model.lora.dropout,
    )


def architecture(cfg: RunConfig, vocab_size: int) -> models.Qwen3Config:
    """The architecture to initialize when no checkpoint is given."""
    if cfg.model.preset != "tiny":
        return models.QWEN3_PRESETS[cfg.model.preset]
    return models.Qwen3Config(
        **dataclasses.asdict(cfg.model.tiny), vocab_size=vocab_size,
        max_position_embeddings=4 * (cfg.rollout.max_prompt_len + cfg.rollout.max_new_tokens))


def data_dir(cfg: RunConfig) -> Path:
    return Path(cfg.task.data_dir or os.environ.get("IBPO_DATA_DIR")
                or Path.home() / ".cache" / "ibpo_jax")


# Bases committed with the source: a warm start is not bit-for-bit portable between hosts
# (README, "Every run starts from a committed base"), so a checkout starts the presets'
# defaults from the same base everywhere, and without spending minutes on warm-starting it.
COMMITTED = Path(__file__).resolve().parents[2] / "experiments" / "warm_starts"


def cache_dir(cfg: RunConfig) -> Path:
    """Where a base found nowhere on the search path is warm-started and cached."""
    return Path(cfg.warm_start.cache_dir) if cfg.warm_start.cache_dir \
        else data_dir(cfg) / "warm_start"


def search_path(cfg: RunConfig) -> list[Path]:
    """The directories searched for a base, in order: `warm_start.search_path` (os.pathsep-
    separated; "" = the committed bases, when this checkout has them), then the cache."""
    if cfg.warm_start.search_path:
        path = [Path(p).expanduser() for p in cfg.warm_start.search_path.split(os.pathsep) if p]
        for p in path:
            if not p.is_dir():
                raise ConfigError(f"config.warm_start.search_path: {p} is not a directory")
    else:
        path = [COMMITTED] if COMMITTED.is_dir() else []
    return path + [cache_dir(cfg)]


def warm_start_dir(cfg: RunConfig, vocab_size: int) -> Path:
    """Directory of the warm-started base policy, named by a hash of what determines it: the
    first directory of `search_path` that holds it, else (to be warm-started) the cache's."""
    key = json.dumps(
        dict(
            # (max_value only when set: bases cached before it existed keep their keys)
            task=cfg.task.name, arith={k: v for k, v in cfg.to_dict()["task"]["arith"].items()
                                       if k != "max_value" or v != 999},
            # another procedural task's own section (arith's keys stay as they were)
            **{k: v for k, v in cfg.to_dict()["task"].items()
               if k == cfg.task.name and k != "arith" and isinstance(v, dict)},
            arch=architecture(cfg, vocab_size).to_hf_dict(),
            warm_start={k: v for k, v in cfg.to_dict()["warm_start"].items()
                        if k not in ("enabled", "cache_dir", "search_path")
                        and (k != "followups" or v)},
            max_prompt_len=cfg.rollout.max_prompt_len, max_new_tokens=cfg.rollout.max_new_tokens,
            dtype=cfg.model.param_dtype,
        ),
        sort_keys=True,
    )
    name = f"{cfg.task.name}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    for directory in search_path(cfg):
        if (directory / name / "config.json").exists():
            return directory / name
    return cache_dir(cfg) / name


def base_identity(cfg: RunConfig, vocab_size: int) -> dict[str, str]:
    """Which base policy a run starts from: a warm start's directory name and the sha256 of its
    weights (hosts with different floating point warm-start different bases from the same
    config, and runs on different bases do not compare), else the checkpoint path."""
    if cfg.model.checkpoint:
        return {"source": cfg.model.checkpoint}
    if not cfg.warm_start.enabled:
        return {"source": f"random init, seed {cfg.seed}"}
    path = warm_start_dir(cfg, vocab_size)
    weights = (path / "model.safetensors").read_bytes()
    return {"source": path.name, "sha256": hashlib.sha256(weights).hexdigest()[:16]}


def load_base(cfg: RunConfig, *, task: Any, tokenizer: Any, mesh: Mesh, log) -> models.Qwen3LM:
    """The base policy (also the frozen KL reference) on `mesh`."""
    dtype = jnp.dtype(cfg.model.dtype)
    options = model_options(cfg)
    if cfg.model.checkpoint:
        m = models.load_hf(cfg.model.checkpoint, dtype=dtype, mesh=mesh, **options)
        if cfg.model.preset not in ("tiny", "hf"):
            expected = models.QWEN3_PRESETS[cfg.model.preset]
            if m.config != expected:
                log(f"note: {cfg.model.checkpoint} differs from preset {cfg.model.preset}; "
                    "using the checkpoint's config.json")
        if m.config.vocab_size < tokenizer.vocab_size:
            raise ConfigError(f"config.model.checkpoint: vocab_size {m.config.vocab_size} < the "
                             f"tokenizer's {tokenizer.vocab_size}")
        log(f"base policy: {cfg.model.checkpoint}")
        return m
    if cfg.warm_start.enabled:
        path = warm_start_dir(cfg, tokenizer.vocab_size)
        if (path / "config.json").exists():
            log(f"base policy: cached warm start {path}")
        else:
            log(f"no base policy for this config: running a supervised warm start on "
                f"{cfg.task.name}'s reference solutions ({cfg.warm_start.steps} steps"
                f"{' + 1/4 on second-round prompts' if cfg.warm_start.followups else ''}) "
                f"-> {path}")
            warm_start.run(cfg, task=task, tokenizer=tokenizer, out_dir=path, log=log,
                           arch=architecture(cfg, tokenizer.vocab_size))
        return models.load_hf(path, dtype=dtype, mesh=mesh, **options)
    log("base policy: random initialization (no checkpoint, no warm start)")
    return models.init(architecture(cfg, tokenizer.vocab_size),
                       jax.random.key(cfg.seed), dtype=dtype, mesh=mesh, **options)
