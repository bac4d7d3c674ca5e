"""Typed, frozen run configuration: the one place a ConfigDict becomes dataclasses.

``load(spec, overrides)`` reads ``configs/<file>.py[:preset]`` (its ``get_config(arg)``),
applies ``--config.a.b=value`` overrides, and returns a frozen :class:`RunConfig`. Every key
is checked here: an unknown key, a value of the wrong type, or an unknown registry name stops
start-up with one message naming the key (and listing the valid choices). Code below the
trainer receives these dataclasses: importing this module does not import ml_collections (only
reading a config file does).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ibpo_jax import registry

if TYPE_CHECKING:
    import ml_collections


class ConfigError(ValueError):
    """A config file, key or value is wrong; the message names it."""


@dataclasses.dataclass(frozen=True)
class ArithTaskConfig:
    num_steps: int
    digits: int
    ops: str


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    name: str
    path: str
    data_dir: str
    train_split: str
    eval_split: str
    test_split: str
    eval_name: str
    eval_path: str
    thinking: bool
    arith: ArithTaskConfig


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    path: str


@dataclasses.dataclass(frozen=True)
class TinyModelConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    preset: str
    checkpoint: str
    dtype: str
    param_dtype: str
    remat: str
    scan_layers: bool
    logits_chunk: int
    tiny: TinyModelConfig


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int
    group_size: int
    max_prompt_len: int
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    name: str
    num_workers: int
    timeout_s: float
    correct: float
    wrong: float


@dataclasses.dataclass(frozen=True)
class IbpoConfig:
    operator: str
    granularity: str
    max_units: int
    lam: float
    credit: str


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    normalize_std: bool
    eps: float
    ddof: int
    gamma: float
    gae_lambda: float


@dataclasses.dataclass(frozen=True)
class LossConfig:
    name: str
    aggregation: str
    clip_eps_low: float
    clip_eps_high: float
    beta: float
    kl_estimator: str
    norm_const: float
    value_coef: float
    value_clip: float


@dataclasses.dataclass(frozen=True)
class CancellationConfig:
    transform: str
    log_drift: bool


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float
    schedule: str
    warmup_steps: int
    weight_decay: float
    b1: float
    b2: float
    grad_clip: float
    epochs: int
    minibatches: int
    microbatches: int
    layout: str


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int
    fsdp: int
    tensor: int


@dataclasses.dataclass(frozen=True)
class TrainLoopConfig:
    steps: int
    eval_every: int
    checkpoint_every: int
    keep_checkpoints: int
    distributed: bool
    progress: bool


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    num_prompts: int
    samples: int
    temperature: float
    top_p: float
    max_new_tokens: int


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    enabled: bool
    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    cache_dir: str


@dataclasses.dataclass(frozen=True)
class RunConfig:
    algo: str
    preset: str
    seed: int
    task: TaskConfig
    tokenizer: TokenizerConfig
    model: ModelConfig
    rollout: RolloutConfig
    reward: RewardConfig
    ibpo: IbpoConfig
    advantage: AdvantageConfig
    loss: LossConfig
    cancellation: CancellationConfig
    optim: OptimConfig
    mesh: MeshConfig
    train: TrainLoopConfig
    eval: EvalConfig
    warm_start: WarmStartConfig

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# Loading a config file and applying overrides.


def load_config_dict(spec: str) -> ml_collections.ConfigDict:
    """Runs ``get_config(arg)`` of ``path[:arg]`` and returns the (locked) ConfigDict."""
    import ml_collections

    path_str, _, arg = spec.partition(":")
    path = Path(path_str)
    if not path.is_file():
        raise ConfigError(f"--config: no config file {path_str!r}")
    # Config files import their siblings as `configs.<name>`: make the package importable.
    package_root = str(path.resolve().parent.parent)
    if package_root not in sys.path:
        sys.path.insert(0, package_root)
    module_spec = importlib.util.spec_from_file_location(f"_ibpo_config_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        raise ConfigError(f"--config: {path_str} failed to load: {e}") from e
    if not hasattr(module, "get_config"):
        raise ConfigError(f"--config: {path_str} defines no get_config(arg=None)")
    try:
        cfg = module.get_config(arg or None)
    except ValueError as e:  # e.g. an unknown preset
        raise ConfigError(f"--config: {spec}: {e}") from e
    if not isinstance(cfg, ml_collections.ConfigDict):
        raise ConfigError(f"--config: {path_str}: get_config returned {type(cfg).__name__}, "
                          "not an ml_collections.ConfigDict")
    cfg.lock()
    return cfg


def apply_override(cfg: ml_collections.ConfigDict, key: str, raw: str) -> None:
    """Sets ``cfg.<key> = raw`` parsed to the type of the existing value."""
    import ml_collections

    *parents, leaf = key.split(".")
    node = cfg
    for depth, part in enumerate(parents):
        if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
            where = ".".join(parents[:depth]) or "<top>"
            raise ConfigError(
                f"unknown config key 'config.{key}': {where} has no section {part!r}; "
                f"valid: {', '.join(sorted(k for k in node.keys()))}"
            )
        node = node[part]
    if leaf not in node:
        raise ConfigError(
            f"unknown config key 'config.{key}'; valid keys here: {', '.join(sorted(node.keys()))}"
        )
    old = node[leaf]
    if isinstance(old, ml_collections.ConfigDict):
        raise ConfigError(f"config.{key} is a section; set one of its keys: {sorted(old.keys())}")
    node[leaf] = _parse_like(old, raw, key)


def _parse_like(old: Any, raw: str, key: str) -> Any:
    try:
        if isinstance(old, bool):
            lowered = raw.strip().lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError("expected true/false")
            return lowered in ("true", "1")
        if isinstance(old, int):
            return int(raw)
        if isinstance(old, float):
            return float(raw)
        if isinstance(old, tuple):
            return tuple(type(old[0])(v) if old else v for v in raw.split(",") if v)
        return raw
    except ValueError as e:
        raise ConfigError(
            f"config.{key}={raw!r}: expected {type(old).__name__} ({e})"
        ) from None


# ---------------------------------------------------------------------------------------------
# ConfigDict -> frozen dataclasses, with type checks.


def _coerce(value: Any, tp: Any, key: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config.{key}={value!r}: expected true/false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config.{key}={value!r}: expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config.{key}={value!r}: expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config.{key}={value!r}: expected a string")
        return value
    raise TypeError(f"unsupported config field type {tp} at {key}")  # a bug here, not in input


def _build(cls: type, node: Any, prefix: str) -> Any:
    if not hasattr(node, "keys"):  # a ConfigDict or a dict
        raise ConfigError(f"config.{prefix} must be a section, got {node!r}")
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    present = set(node.keys())
    unknown = sorted(present - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(f'{prefix}.{k}'.lstrip('.') for k in unknown)}; "
            f"valid: {', '.join(fields)}"
        )
    missing = [f for f in fields if f not in present]
    if missing:
        raise ConfigError(f"config section {prefix or '<top>'} lacks key(s): {', '.join(missing)}")
    kwargs = {
        name: _coerce(node[name], hints[name], f"{prefix}.{name}".lstrip("."))
        for name in fields
    }
    return cls(**kwargs)


_DTYPES = ("float32", "bfloat16", "float16")
_CHOICES = {
    "model.dtype": _DTYPES,
    "model.param_dtype": _DTYPES,
    "model.remat": ("none", "dots", "full"),  # models.REMAT_POLICIES
    "ibpo.granularity": ("step", "token"),
    "ibpo.credit": ("sequence", "token"),
    "optim.schedule": ("constant", "cosine"),
    "optim.layout": ("grouped", "packed", "rows"),  # trainer/step.py
}


def _validate(c: RunConfig) -> None:
    flat = _flatten(c.to_dict())
    for key, choices in _CHOICES.items():
        if flat[key] not in choices:
            raise ConfigError(f"config.{key}={flat[key]!r}; valid: {', '.join(choices)}")
    from ibpo_jax.models import QWEN3_PRESETS

    presets = ("tiny", "hf", *QWEN3_PRESETS)
    if c.model.preset not in presets:
        raise ConfigError(f"config.model.preset={c.model.preset!r}; valid: {', '.join(presets)}")
    if c.model.preset == "hf" and not c.model.checkpoint:
        raise ConfigError("config.model.preset='hf' reads the architecture from "
                          "config.model.checkpoint's config.json: set config.model.checkpoint")
    registry.OPERATORS.check(c.ibpo.operator, key="config.ibpo.operator")
    registry.LOSSES.check(c.loss.name, key="config.loss.name")
    registry.AGGREGATIONS.check(c.loss.aggregation, key="config.loss.aggregation")
    registry.KL_ESTIMATORS.check(c.loss.kl_estimator, key="config.loss.kl_estimator")
    registry.TRANSFORMS.check(c.cancellation.transform, key="config.cancellation.transform")
    registry.TASKS.check(c.task.name, key="config.task.name")
    if c.task.eval_name:
        registry.TASKS.check(c.task.eval_name, key="config.task.eval_name")
    if c.reward.name:
        registry.REWARDS.check(c.reward.name, key="config.reward.name")
    positive = [
        "rollout.prompts_per_step", "rollout.group_size", "rollout.max_prompt_len",
        "rollout.max_new_tokens", "ibpo.max_units", "optim.epochs", "optim.minibatches",
        "optim.microbatches", "train.steps", "train.eval_every",
        "train.checkpoint_every", "train.keep_checkpoints", "eval.num_prompts", "eval.samples",
        "warm_start.steps", "warm_start.batch_size", "task.arith.num_steps", "task.arith.digits",
    ]
    for key in positive:
        if flat[key] <= 0:
            raise ConfigError(f"config.{key}={flat[key]} must be > 0")
    nonneg = ["ibpo.lam", "loss.beta", "loss.clip_eps_low", "loss.clip_eps_high",
              "optim.lr", "optim.warmup_steps", "optim.grad_clip", "optim.weight_decay",
              "advantage.eps", "rollout.temperature", "eval.temperature", "rollout.top_k",
              "loss.norm_const", "reward.num_workers", "advantage.ddof", "model.logits_chunk"]
    for key in nonneg:
        if flat[key] < 0:
            raise ConfigError(f"config.{key}={flat[key]} must be >= 0")
    for key in ("rollout.top_p", "eval.top_p"):
        if not 0.0 < flat[key] <= 1.0:
            raise ConfigError(f"config.{key}={flat[key]} must be in (0, 1]")
    if c.warm_start.warmup_steps >= c.warm_start.steps:
        raise ConfigError(f"config.warm_start.warmup_steps={c.warm_start.warmup_steps} must be < "
                          f"config.warm_start.steps={c.warm_start.steps}")
    if c.rollout.group_size < 2 and c.ibpo.operator != "terminal":
        raise ConfigError("config.rollout.group_size must be >= 2 for a comparison operator")
    # Whole groups per micro-batch ("grouped" and "rows" layouts; cancellation transforms
    # need them); packed rows split the same way.
    if c.rollout.prompts_per_step % (c.optim.minibatches * c.optim.microbatches):
        raise ConfigError(
            f"config.optim.minibatches x config.optim.microbatches = "
            f"{c.optim.minibatches * c.optim.microbatches} must divide "
            f"config.rollout.prompts_per_step = {c.rollout.prompts_per_step} (whole groups)"
        )
    if c.loss.name == "ppo" and c.ibpo.credit == "token":
        raise ConfigError("config.ibpo.credit='token' is for group estimators, not loss.name='ppo'")


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}".lstrip(".")
        if isinstance(v, dict):
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


def from_config_dict(cfg: ml_collections.ConfigDict | dict) -> RunConfig:
    """Builds and validates the frozen RunConfig."""
    run = _build(RunConfig, cfg, "")
    _validate(run)
    return run


def from_dict(d: dict[str, Any]) -> RunConfig:
    """Rebuilds a RunConfig from ``RunConfig.to_dict()`` (checkpoints store it as JSON)."""
    return from_config_dict(d)


def load(spec: str, overrides: list[tuple[str, str]] = ()) -> RunConfig:
    """``spec`` = "configs/x.py[:preset]"; overrides = [("optim.lr", "1e-4"), ...]."""
    cfg = load_config_dict(spec)
    for key, raw in overrides:
        apply_override(cfg, key, raw)
    return from_config_dict(cfg)




def parse_overrides(args: list[str]) -> list[tuple[str, str]]:
    """``["--config.optim.lr=1e-4", "--config.train.steps", "5"]`` -> [(key, raw), ...]."""
    overrides, i = [], 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--config."):
            raise ConfigError(f"unrecognized argument {arg!r} (overrides look like "
                              "--config.optim.lr=1e-4)")
        key, eq, raw = arg.removeprefix("--config.").partition("=")
        if not eq:
            if i + 1 >= len(args):
                raise ConfigError(f"{arg} needs a value")
            raw, i = args[i + 1], i + 1
        overrides.append((key, raw))
        i += 1
    return overrides
