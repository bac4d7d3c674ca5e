"""The config sections of what a run reads and is judged on: the task (with the procedural tasks'
generator sections, which each task's module defines: `data.tasks`), evaluation and the
supervised warm start. Same conventions as `config.sections`
(one frozen dataclass per section with its defaults, field docstrings and checks); assembled by
`ibpo_jax.config` (import the sections from there)."""

from __future__ import annotations

import dataclasses

from ibpo_jax.config import registry
from ibpo_jax.config.schema import Section, with_sections


@dataclasses.dataclass(frozen=True)
class TaskCore(Section):
    """The task section's own fields; `TaskConfig` adds each procedural task's section
    (`registry.PROCEDURAL`: `task.arith`, `task.countdown`)."""

    KEY = "task"
    name: str = "arith"
    """A registry.TASKS name."""
    path: str = ""
    """Local file or directory of file-backed tasks (math_jsonl, math500, ...)."""
    data_dir: str = ""
    """Where built datasets live ("" = $IBPO_DATA_DIR or ~/.cache/ibpo_jax)."""
    train_split: str = "train"
    """Split of the training task that RL samples prompts from."""
    eval_split: str = "validation"
    """Split evaluated during training (if the evaluation task has it)."""
    test_split: str = "test"
    """Split `ibpo_jax.evaluate` scores by default."""
    eval_name: str = ""
    """Evaluate on another task (e.g. "math500"); "" = the training task."""
    eval_path: str = ""
    """The evaluation task's files (file-backed tasks)."""
    thinking: bool = False
    """Qwen3 chat template's thinking switch (HF tokenizers only)."""
    fields: str = ""
    """Columns under other names, "column:field,..." (e.g. "question:prompt"; docs/data.md)."""

    def check(self):
        self._registered("name", registry.TASKS)
        if self.eval_name:
            self._registered("eval_name", registry.TASKS)


# One last field per procedural task: its generator's section, in name order (config.task.<name>).
TaskConfig = with_sections(
    TaskCore, "TaskConfig", __name__,
    {n: registry.PROCEDURAL.get(n).section for n in registry.PROCEDURAL.names()},
    "What to train and evaluate on: `TaskCore` and the procedural tasks' sections.")


@dataclasses.dataclass(frozen=True)
class EvalConfig(Section):
    KEY = "eval"
    num_prompts: int = 256
    """Evaluation problems (the first of the split)."""
    samples: int = 1
    """k of avg@k."""
    temperature: float = 0.0
    """0 = greedy, else >= MIN_TEMPERATURE."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    max_new_tokens: int = 0
    """0 = rollout.max_new_tokens."""

    def check(self):
        self._positive("num_prompts", "samples")
        self._temperature("temperature")
        self._require("top_p", 0 < self.top_p <= 1, "must be in (0, 1]")
        self._nonneg("max_new_tokens")


@dataclasses.dataclass(frozen=True)
class WarmStartConfig(Section):
    KEY = "warm_start"
    enabled: bool = False
    """Supervised warm start on the task's reference solutions."""
    steps: int = 400
    """Supervised steps of the warm start."""
    batch_size: int = 64
    """Reference solutions per warm-start step."""
    lr: float = 3e-3
    """Peak learning rate of the warm start."""
    warmup_steps: int = 50
    """Linear warm-up of the warm start; < steps."""
    cache_dir: str = ""
    """Where a base found nowhere on search_path is warm-started and cached; searched last;
    "" = <data_dir>/warm_start."""
    search_path: str = ""
    """Directories (os.pathsep-separated) searched in order for a base before the cache; "" =
    experiments/warm_starts/ of this checkout (the committed bases) when it exists."""
    followups: bool = False
    """Also teach the second-round prompt formats (data/followups.py: corrections, SCoRe's
    retry), which an instruct LLM follows zero-shot: steps // 4 extra steps on them."""

    def check(self):
        self._positive("steps", "batch_size")
        self._nonneg("lr", "warmup_steps")
        self._require("warmup_steps", self.warmup_steps < self.steps,
                      f"must be < config.warm_start.steps={self.steps}")
