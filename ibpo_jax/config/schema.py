"""The schema machinery every config section builds on: a frozen dataclass whose fields are
type-checked (ints widen to float, floats are finite, `int | str` unions take either) before the
section's own `check`, and the one error a bad key or value raises, naming the full key
(``config.optim.lr=inf: must be finite``). The core's sections are in `config.sections`, the
methods' beside their code (`ibpo_jax/methods/`); `ibpo_jax.config` assembles `RunConfig`."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, ClassVar

from ibpo_jax.config import registry

MIN_TEMPERATURE = 1e-3  # sampling temperatures are 0 (greedy) or at least this


class ConfigError(ValueError):
    """A config file, key or value is wrong; the message names it."""


class _WrongType(ConfigError):
    """A value of another type than its field's (a union tries its next member)."""


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _typed(value: Any, tp: Any, key: str) -> Any:
    """`value` checked against the field type `tp` (ints widen to float; floats are finite)."""
    members = typing.get_args(tp) if isinstance(tp, types.UnionType) else ()
    if members:  # e.g. int | str: the first member type that takes the value
        for member in members:
            try:
                return _typed(value, member, key)
            except _WrongType:  # a bad value of a member's type (nan) is an error as it is
                pass
        names = " or ".join(m.__name__ for m in members)
        raise _WrongType(f"config.{key}={value!r}: expected {names}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, tp):
            raise _WrongType(f"config.{key} must be a section ({tp.__name__}), got {value!r}")
        return value
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and not math.isfinite(value):
            raise ConfigError(f"config.{key}={value!r}: must be finite")
        value = float(value) if ok else value
    elif tp is str:
        ok = isinstance(value, str)
    else:
        raise TypeError(f"unsupported config field type {tp} at {key}")  # a bug here
    if not ok:
        raise _WrongType(f"config.{key}={value!r}: expected {tp.__name__}")
    return value


@dataclasses.dataclass(frozen=True)
class Section:
    """Base of the sections: field type checks, then the section's own `check`."""

    KEY: ClassVar[str] = ""  # the section's path under `config.`

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = _typed(getattr(self, f.name), hints(type(self))[f.name], self._key(f.name))
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Range and choice checks of this section (override)."""

    def _key(self, name: str) -> str:
        return f"{self.KEY}.{name}".lstrip(".")

    def _require(self, name: str, ok: bool, problem: str) -> None:
        if not ok:
            raise ConfigError(f"config.{self._key(name)}={getattr(self, name)!r}: {problem}")

    def _positive(self, *names: str) -> None:
        for name in names:
            self._require(name, getattr(self, name) > 0, "must be > 0")

    def _nonneg(self, *names: str) -> None:
        for name in names:
            self._require(name, getattr(self, name) >= 0, "must be >= 0")

    def _one_of(self, name: str, choices: tuple[str, ...]) -> None:
        self._require(name, getattr(self, name) in choices, f"valid: {', '.join(choices)}")

    def _registered(self, name: str, reg: registry.Registry) -> None:
        reg.check(getattr(self, name), key=f"config.{self._key(name)}")

    def _temperature(self, name: str) -> None:
        t = getattr(self, name)
        self._require(name, t == 0 or t >= MIN_TEMPERATURE,
                      f"must be 0 (greedy) or >= {MIN_TEMPERATURE}")

    def _unit(self, name: str, *, open_high: bool = False) -> None:
        x, top = getattr(self, name), ")" if open_high else "]"
        self._require(name, 0 <= x < 1 if open_high else 0 <= x <= 1, f"must be in [0, 1{top}")


def with_sections(core: type, name: str, module: str, sections: dict[str, type],
                  doc: str) -> type:
    """A frozen dataclass `name` (importable as `module`.`name`, so it pickles): `core`'s fields,
    then one per entry of `sections` (field name -> section class, defaulting to its defaults).
    How the run config adds the sections that other layers register (methods, tasks)."""
    fields = [(n, section, dataclasses.field(default_factory=section))
              for n, section in sections.items()]
    cls = dataclasses.make_dataclass(name, fields, bases=(core,), frozen=True)
    cls.__module__, cls.__doc__ = module, doc
    return cls
