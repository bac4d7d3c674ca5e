"""Typed, frozen run configuration: one dataclass per config section, the single schema.

Each section is a frozen dataclass that carries its defaults, a docstring per field and its own
checks (`config.schema.Section`): the core's in `config/sections.py`, `config/mesh_sections.py`,
`config/task_sections.py`, `config/logging_section.py` and `config/tiny_model.py`, each method's
beside its code (`ibpo_jax/methods/`), so a new knob is one field in its section plus its use.
Checks that span sections are `RunConfig.check` and, for the methods a config turns on
(`registry.METHODS`), each method's own `check`.
`configs/base.py` builds its ConfigDict from `defaults()`; ``load(spec, overrides)`` reads
``configs/<file>.py[:preset]`` (its ``get_config(arg)``), applies ``--config.a.b=value``
overrides and returns a frozen :class:`RunConfig`. An unknown key, a value of the wrong type,
a non-finite float, a value outside its range or an unknown registry name stops start-up with
one message naming the full key (``config.optim.lr=inf: must be finite``). Code below the
trainer receives these dataclasses: importing this module does not import ml_collections (only
reading a config file does).
"""


from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ibpo_jax.config.logging_section import LoggingConfig
from ibpo_jax.config.mesh_sections import MeshConfig
from ibpo_jax.config.registry import ESTIMATORS, METHODS, SECTIONS
from ibpo_jax.config.schema import with_sections
from ibpo_jax.config.sections import (
    MIN_TEMPERATURE,
    AdvantageConfig,
    CancellationConfig,
    ConfigError,
    DiagnosticsConfig,
    IbpoConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    Section,
    TinyModelConfig,
    TokenizerConfig,
    TrainLoopConfig,
    hints,
)
from ibpo_jax.config.task_sections import EvalConfig, TaskConfig, WarmStartConfig

if TYPE_CHECKING:
    import ml_collections

__all__ = [
    "MIN_TEMPERATURE", "AdvantageConfig", "CancellationConfig", "ConfigError",
    "DiagnosticsConfig", "EvalConfig", "IbpoConfig", "LoggingConfig", "LossConfig", "MeshConfig",
    "ModelConfig", "OptimConfig", "RewardConfig", "RolloutConfig", "RunConfig",
    "TaskConfig", "TinyModelConfig", "TokenizerConfig", "TrainLoopConfig",
    "WarmStartConfig",
    "defaults", "from_config_dict", "from_dict", "load", "load_config_dict", "parse_overrides",
]


@dataclasses.dataclass(frozen=True)
class CoreConfig(Section):
    """The run config's own sections; `RunConfig` adds the methods' (`registry.SECTIONS`)."""

    algo: str = "ibpo_gspo"
    """The algorithm (configs/<algo>.py)."""
    preset: str = ""
    """The preset the config file applied ("" = these defaults)."""
    seed: int = 0
    """Seeds the data order, the sampler and random initialization."""
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    """What to train and evaluate on."""
    tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
    """Which tokenizer."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy's architecture, dtypes and memory settings."""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """How responses are sampled for training."""
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    """How responses are scored."""
    ibpo: IbpoConfig = dataclasses.field(default_factory=IbpoConfig)
    """The comparison operator φ and its weight λ (paper §3.2-3.3)."""
    advantage: AdvantageConfig = dataclasses.field(default_factory=AdvantageConfig)
    """Group normalization and GAE (DESIGN §3)."""
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    """The policy objective (DESIGN §4)."""
    cancellation: CancellationConfig = dataclasses.field(default_factory=CancellationConfig)
    """Token gradient cancellation transforms (DESIGN §5)."""
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    """The optimizer and how a rollout batch is split into updates."""
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    """The device mesh."""
    train: TrainLoopConfig = dataclasses.field(default_factory=TrainLoopConfig)
    """Loop length, evaluation and checkpoints."""
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    """Held-out evaluation (avg@k)."""
    warm_start: WarmStartConfig = dataclasses.field(default_factory=WarmStartConfig)
    """The supervised warm start of the embedded task."""
    diagnostics: DiagnosticsConfig = dataclasses.field(default_factory=DiagnosticsConfig)
    """Extra, costlier diagnostics."""
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    """Metric backends and the evaluation samples shown."""

    def _check_estimator(self) -> None:
        """A named `advantage.estimator` takes what the run gives it (core.advantages.TAKES)."""
        name = self.advantage.estimator
        if name == "auto":
            return
        from ibpo_jax.core.advantages import estimator_kind  # jax: only when one is named

        kind = estimator_kind(ESTIMATORS.get(name))
        needs = ("value" if self.loss.name == "ppo" else
                 "token" if self.ibpo.credit == "token" else "group")
        if kind != needs:
            why = {"value": "config.loss.name='ppo' (its value head)",
                   "token": "config.ibpo.credit='token' (per-token credit)",
                   "group": f"config.loss.name={self.loss.name!r} with "
                            f"config.ibpo.credit={self.ibpo.credit!r}"}[needs]
            raise ConfigError(f"config.advantage.estimator={name!r} takes {kind} inputs; "
                              f"{why} needs a {needs} estimator")

    def _reads_first_round_labels(self) -> bool:
        """The operator reads labels the trainer adds to the first round only: the checker's
        first wrong step, the policy's continuations (`comparison.NEEDS_TRUTH`,
        `NEEDS_VOUCHED`)."""
        from ibpo_jax.core import comparison  # jax: only when a run adds a round

        return self.ibpo.operator in comparison.NEEDS_TRUTH + comparison.NEEDS_VOUCHED

    def check(self):
        """Checks that span sections."""
        if self.rollout.group_size < 2 and self.ibpo.operator != "terminal":
            raise ConfigError(f"config.rollout.group_size={self.rollout.group_size}: must be "
                              ">= 2 for a comparison operator")
        # Whole groups per micro-batch ("grouped" and "rows" layouts; cancellation transforms
        # need them); packed rows split the same way.
        # "auto" micro-batches, and those of micro_batch_rows, are resolved to a divisor at
        # start-up (ibpo_jax.plan).
        auto = self.optim.microbatches == "auto" or self.optim.micro_batch_rows > 0
        chunks = self.optim.minibatches * (1 if auto else self.optim.microbatches)
        if self.rollout.prompts_per_step % chunks:
            what = "config.optim.minibatches" if auto else \
                "config.optim.minibatches x config.optim.microbatches"
            raise ConfigError(
                f"{what} = {chunks} must divide "
                f"config.rollout.prompts_per_step = {self.rollout.prompts_per_step} "
                "(whole groups)")
        if self.rollout.partial and self.mesh.rollout.devices:
            raise ConfigError("config.rollout.partial=True samples on the training mesh: set "
                              "config.mesh.rollout.devices=0")
        if self.loss.name == "ppo" and self.ibpo.credit == "token":
            raise ConfigError("config.ibpo.credit='token' is for group estimators, not "
                              "config.loss.name='ppo'")
        self._check_estimator()
        rounds = [METHODS.get(m) for m in self.methods if METHODS.get(m).adds_round()]
        if len(rounds) > 1:  # the update joins the first round and one more
            raise ConfigError(f"{' and '.join(m.switch for m in rounds)} each add a second "
                              "round to the RL step: set one")
        if rounds and self.rollout.dynamic_sampling:  # its filler rows would enter the round
            raise ConfigError("config.rollout.dynamic_sampling=True: not with the extra round "
                              f"of {rounds[0].switch}")
        if rounds and self._reads_first_round_labels():  # the round's rows carry none
            raise ConfigError(f"config.ibpo.operator={self.ibpo.operator!r} reads labels only "
                              f"the first round has: not with the extra round of "
                              f"{rounds[0].switch}")
        for name in self.methods:
            METHODS.get(name).check(self)

    @property
    def methods(self) -> tuple[str, ...]:
        """The registry.METHODS this config turns on (each method's `enabled`), in name order:
        the stages they add run in this order at their fixed points of the RL step."""
        return tuple(m for m in METHODS.names() if METHODS.get(m).enabled(self))

    @property
    def rows_per_step(self) -> int:
        """N = B·G: the rows (trajectories) of an RL step's first round."""
        return self.rollout.prompts_per_step * self.rollout.group_size

    @property
    def trajectories_per_step(self) -> int:
        """Trajectories an RL step samples whatever the batch: the first round's B·G rows and
        the rows of methods whose round has a fixed size (SCoRe: B·G second attempts; a
        correction round's size depends on the batch, DESIGN §6)."""
        per_row = sum(METHODS.get(m).trajectories_per_row for m in self.methods)
        return self.rows_per_step * (1 + per_row)

    def sampling(self, *, evaluation: bool = False) -> dict[str, Any]:
        """The sampler settings (`sampling.generate_fn` keywords) of rollouts or, `evaluation`,
        of evaluation (whose max_new_tokens 0 means the rollout's)."""
        if evaluation:
            e = self.eval
            return dict(max_new_tokens=e.max_new_tokens or self.rollout.max_new_tokens,
                        temperature=e.temperature, top_p=e.top_p)
        r = self.rollout
        return dict(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                    top_k=r.top_k)

    @property
    def update_layout(self) -> str:
        """optim.layout, except that a method's second round (corrections, SCoRe), whose rows
        have prompts of their own, turns "grouped" into "packed", and a cancellation transform,
        which needs the rows of a group together in one micro-batch, turns "packed" into
        "rows"."""
        layout = self.optim.layout
        if layout == "grouped" and any(METHODS.get(m).adds_round() for m in self.methods):
            layout = "packed"  # second-round rows have prompts of their own
        if layout == "packed" and self.cancellation.transform != "none":
            return "rows"
        return layout

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def _with_method_sections(core: type) -> type:
    """`core` with one last field per registered method section (`registry.SECTIONS`, in name
    order), each defaulting to its section's defaults."""
    sections = {name: SECTIONS.get(name) for name in SECTIONS.names()}
    for name, section in sections.items():
        if section.KEY != name:
            raise TypeError(f"method section {section.__name__} is registered as {name!r} but "
                            f"its KEY is {section.KEY!r}")
    return with_sections(core, "RunConfig", __name__, sections, (
        "The whole run's config: the core's sections (`CoreConfig`) and the methods' "
        f"({', '.join(f'`{n}`' for n in sections)})."))


RunConfig = _with_method_sections(CoreConfig)


def defaults(cls: type = RunConfig) -> dict[str, Any]:
    """The schema's defaults as a nested dict (`configs/base.py`'s ConfigDict): the values
    RunConfig() holds, except that a default a section resolves from its other fields (a word
    such as "auto": LossConfig's clip range, from the loss name) stays the word, for the
    algorithm and the overrides to set those fields first."""
    out = {}
    built = cls()
    for f in dataclasses.fields(cls):
        value, tp = getattr(built, f.name), hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            out[f.name] = defaults(tp)
        else:
            out[f.name] = f.default if isinstance(f.default, str) else value
    return out


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
    number = _word_or(key)
    if number is not None:  # a number knob that also takes "auto"
        if raw.strip() == "auto":
            value = "auto"
        else:
            try:
                value = number(raw)
            except ValueError:
                raise ConfigError(f'config.{key}={raw!r}: expected {number.__name__} or '
                                  '"auto"') from None
        with node.ignore_type():
            node[leaf] = value
        return
    node[leaf] = _parse_like(old, raw, key)


def _word_or(key: str) -> type | None:
    """The number type of RunConfig's field at dotted `key` when it is typed `int | str` or
    `float | str` (a number or "auto"), else None."""
    tp: Any = RunConfig
    for part in key.split("."):
        if not dataclasses.is_dataclass(tp) or part not in hints(tp):
            return None
        tp = hints(tp)[part]
    members = typing.get_args(tp) if isinstance(tp, types.UnionType) else ()
    numbers = [m for m in members if m in (int, float)]
    return numbers[0] if str in members and numbers else None


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
        return raw
    except ValueError as e:
        raise ConfigError(
            f"config.{key}={raw!r}: expected {type(old).__name__} ({e})"
        ) from None


def _build(cls: type, node: Any, prefix: str) -> Any:
    """The section `cls` from a ConfigDict / dict; keys it lacks keep their defaults (a
    checkpoint written before a knob existed still loads)."""
    if not hasattr(node, "keys"):  # a ConfigDict or a dict
        raise ConfigError(f"config.{prefix} must be a section, got {node!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(node.keys()) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(f'{prefix}.{k}'.lstrip('.') for k in unknown)}; "
            f"valid: {', '.join(fields)}"
        )
    kwargs = {}
    for name in node.keys():
        tp = hints(cls)[name]
        key = f"{prefix}.{name}".lstrip(".")
        kwargs[name] = _build(tp, node[name], key) if dataclasses.is_dataclass(tp) else node[name]
    return cls(**kwargs)


def from_config_dict(cfg: ml_collections.ConfigDict | dict) -> RunConfig:
    """Builds the frozen RunConfig; every section checks itself as it is built."""
    return _build(RunConfig, cfg, "")


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
