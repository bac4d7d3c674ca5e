"""The typed, frozen run configuration: the sections and their schema (`schema`, `sections`,
`task_sections`, `logging_section`, `tiny_model`), the run config that assembles them (`run`), the
docs it prints (`docs`) and the name -> implementation registries (`registry`).

``RunConfig``, ``load``, ``ConfigError`` and the rest of `run`'s names are attributes of this
package (``from ibpo_jax.config import RunConfig``), loaded on first use (PEP 562): the layers
below the run config (the math's registry, the methods' sections) import `schema` and
`registry` from here, and must not pull in the run config, which assembles those methods'
sections.
"""

import importlib
from typing import Any

_SUBMODULES = frozenset({"docs", "logging_section", "registry", "run", "schema", "sections",
                         "task_sections", "tiny_model"})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES or name.startswith("__"):  # not loaded yet: the import system's turn
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("ibpo_jax.config.run"), name)
