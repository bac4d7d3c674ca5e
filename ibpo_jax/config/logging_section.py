"""The `logging` config section: where a run's metrics go and how many evaluation samples it
shows. Its own module, like `config/task_sections.py`, to keep `config/sections.py` small; imported
through `ibpo_jax.config` like the others. Importing it does not import a logging library."""

from __future__ import annotations

import dataclasses
import importlib.util

from ibpo_jax.config.schema import Section

# The backends `trainer.logs.RunLog` writes to. jsonl is required: resume, summary.md and the
# reproduction read metrics.jsonl.
LOG_BACKENDS = ("jsonl", "tensorboard", "wandb")


@dataclasses.dataclass(frozen=True)
class LoggingConfig(Section):
    KEY = "logging"
    backends: str = "tensorboard,jsonl"
    """Comma-separated metric sinks: jsonl (metrics.jsonl, required), tensorboard
    (DIR/tensorboard/, tags grouped train/ eval/ credit/ appendix_a/ time/), wandb (pip install
    'ibpo-jax[wandb]'; offline under DIR/wandb/ unless WANDB_MODE is set)."""
    samples: int = 4
    """Evaluation completions written per evaluation to samples.jsonl and TensorBoard text (the
    first sample of the first problems); 0 = none."""

    def names(self) -> tuple[str, ...]:
        """The backends, in the order given."""
        return tuple(b.strip() for b in self.backends.split(",") if b.strip())

    def check(self):
        names = self.names()
        unknown = [b for b in names if b not in LOG_BACKENDS]
        self._require("backends", not unknown,
                      f"unknown backend {', '.join(map(repr, unknown))}; valid: "
                      f"{', '.join(LOG_BACKENDS)}")
        self._require("backends", "jsonl" in names,
                      "must include jsonl (resume, summary.md and the reproduction read "
                      "metrics.jsonl)")
        self._require("backends", len(set(names)) == len(names), "a backend is repeated")
        # At load, not minutes later when the run's log opens.
        self._require("backends", "wandb" not in names or importlib.util.find_spec("wandb"),
                      "wandb is not installed: pip install 'ibpo-jax[wandb]'")
        self._nonneg("samples")
