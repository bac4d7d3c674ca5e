"""Name -> implementation registries for everything a config can select by name.

One place lists what a config string may say: comparison operators, advantage estimators,
policy losses, loss aggregations, KL estimators, cancellation transforms, rewards and tasks.
An unknown name raises one error that lists the valid ones, so a typo in a config fails at
start-up with the fix in the message.

Modules register their functions at import time with ``@REGISTRY.register("name")``;
``ibpo_jax/__init__.py`` imports them so every registry is complete once the package is
imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A config named something that is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message; keep it readable.
        return str(self.args[0])


class Registry(Generic[T]):
    """A named mapping from string keys to implementations of one kind."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str, *, key: str | None = None) -> T:
        """Returns the entry; `key` (e.g. a config path) is named in the error."""
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
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


OPERATORS: Registry[Callable[..., Any]] = Registry("comparison operator")
ESTIMATORS: Registry[Callable[..., Any]] = Registry("advantage estimator")
LOSSES: Registry[Callable[..., Any]] = Registry("policy loss")
AGGREGATIONS: Registry[Callable[..., Any]] = Registry("loss aggregation")
KL_ESTIMATORS: Registry[Callable[..., Any]] = Registry("KL estimator")
TRANSFORMS: Registry[Callable[..., Any]] = Registry("cancellation transform")
REWARDS: Registry[Callable[..., Any]] = Registry("reward")
TASKS: Registry[Callable[..., Any]] = Registry("task")
