"""Name -> implementation registries for everything a config can select by name.

One place lists what a config string may say: comparison operators, advantage estimators,
policy losses, loss aggregations, KL estimators, cancellation transforms, rewards, tasks, and
the methods that add a stage to the RL step.
An unknown name raises one error that lists the valid ones, so a typo in a config fails at
start-up with the fix in the message.

Modules register their functions at import time with ``@REGISTRY.register("name")``. Each
registry knows which modules define its entries and imports them on first lookup, so
``OPERATORS.get("lcs")`` works without the caller importing ``ibpo_jax.core.comparison`` first and
importing this module stays free of jax.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A config named something that is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message; keep it readable.
        return str(self.args[0])


class UnknownSplitError(UnknownNameError, ValueError):
    """A config named a split that the task does not have (also a ValueError, which the
    tasks raised before)."""


class Registry(Generic[T]):
    """A named mapping from string keys to implementations of one kind."""

    def __init__(self, kind: str, modules: tuple[str, ...] = ()):
        self.kind = kind
        self._modules = modules  # imported on first lookup; they register the entries
        self._loaded = False
        self._entries: dict[str, T] = {}

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True  # set first: the imported modules may look entries up
            try:
                for module in self._modules:
                    importlib.import_module(module)
            except BaseException:
                self._loaded = False  # a failed import must fail again, not list no entries
                raise

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str, *, key: str | None = None) -> T:
        """Returns the entry; `key` (e.g. a config path) is named in the error."""
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            where = f" (config key {key})" if key else ""
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}{where}; valid: {', '.join(self.names())}"
            ) from None

    def check(self, name: str, *, key: str | None = None) -> str:
        """Validates a name without using it; returns it."""
        self.get(name, key=key)
        return name

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


OPERATORS: Registry[Callable[..., Any]] = Registry(
    "comparison operator", ("ibpo_jax.core.comparison",))
ESTIMATORS: Registry[Callable[..., Any]] = Registry(
    "advantage estimator", ("ibpo_jax.core.advantages",))
LOSSES: Registry[Callable[..., Any]] = Registry("policy loss", ("ibpo_jax.core.losses",))
AGGREGATIONS: Registry[Callable[..., Any]] = Registry("loss aggregation", ("ibpo_jax.core.losses",))
KL_ESTIMATORS: Registry[Callable[..., Any]] = Registry("KL estimator", ("ibpo_jax.core.kl",))
TRANSFORMS: Registry[Callable[..., Any]] = Registry(
    "cancellation transform", ("ibpo_jax.core.cancellation",))
REWARDS: Registry[Callable[..., Any]] = Registry("reward", ("ibpo_jax.rewards", "ibpo_jax.data"))
TASKS: Registry[Callable[..., Any]] = Registry("task", ("ibpo_jax.data",))
# Procedural tasks, name -> `data.tasks.ProceduralTask` (each also a TASKS and a REWARDS
# entry; its config section is `config.task.<name>`).
PROCEDURAL: Registry[Any] = Registry("procedural task", ("ibpo_jax.data",))
# The methods' own config sections, `RunConfig`'s last fields: name (= the section's KEY) ->
# a `schema.Section` subclass, registered by the method's config module (which imports nothing
# heavier than the schema), so the run config assembles them without importing the methods.
SECTIONS: Registry[type] = Registry("method config section", (
    "ibpo_jax.methods.prm.config", "ibpo_jax.methods.score.config"))
# Methods that add a stage to the RL step (DESIGN §6-§7), name -> `trainer.hooks.Method`
# subclass (its factory); a config turns one on through its own section (`Method.enabled`).
METHODS: Registry[Any] = Registry("method", (
    "ibpo_jax.methods.corrections", "ibpo_jax.methods.prm.method",
    "ibpo_jax.methods.score.method"))
