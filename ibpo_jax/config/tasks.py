"""The config sections of what a run reads and is judged on: the task (and the embedded tasks'
generators), evaluation and the supervised warm start. Same conventions as `config.sections`
(one frozen dataclass per section with its defaults, field docstrings and checks); assembled by
`ibpo_jax.config` (import the sections from there)."""

from __future__ import annotations

import dataclasses

from ibpo_jax.config import registry
from ibpo_jax.config.schema import Section
from ibpo_jax.data import arith, countdown

# The generators' own defaults are the one source of the task sections' defaults (a change
# there changes the runs' data; the sections only name them as config keys).
_ARITH, _COUNTDOWN = arith.ArithConfig(), countdown.CountdownConfig()


@dataclasses.dataclass(frozen=True)
class ArithTaskConfig(Section):
    KEY = "task.arith"
    num_steps: int = _ARITH.num_steps
    """Operations per problem of the embedded `arith` task."""
    digits: int = 1
    """Digits of the start number and of the + / - operands (the runs' own default: one digit,
    below the generator's `arith.ArithConfig().digits`)."""
    ops: str = _ARITH.ops
    """Operators to draw from: distinct characters of '+-*/'."""
    max_value: int = _ARITH.max_value
    """Every intermediate value stays in [0, max_value]."""

    def check(self):
        self._positive("num_steps", "digits")
        self._require("max_value", self.max_value >= 10 ** self.digits - 1,
                      f"must be >= the largest {self.digits}-digit operand")
        self._require("ops", bool(self.ops) and not set(self.ops) - set("+-*/")
                      and len(set(self.ops)) == len(self.ops), "distinct characters of '+-*/'")


@dataclasses.dataclass(frozen=True)
class CountdownTaskConfig(Section):
    KEY = "task.countdown"
    min_numbers: int = _COUNTDOWN.min_numbers
    """Fewest numbers a `countdown` problem gives (>= 2)."""
    max_numbers: int = _COUNTDOWN.max_numbers
    """Most numbers a problem gives (<= 8)."""
    max_number: int = _COUNTDOWN.max_number
    """The numbers are distinct integers in [2, max_number]."""
    max_value: int = _COUNTDOWN.max_value
    """Every result and the target are integers in [1, max_value]."""
    min_target: int = _COUNTDOWN.min_target
    """Smallest target (a target is never one of the numbers)."""
    min_solutions: int = _COUNTDOWN.min_solutions
    """Keep only problems with at least this many distinct shortest solutions (k)."""
    num_train: int = countdown.NUM_TRAIN
    """Problems in the training split (validation and test: 500 each); the defaults allow
    about 40,000 distinct problems."""

    def check(self):
        self._require("min_numbers", 2 <= self.min_numbers <= self.max_numbers,
                      f"must be in [2, config.task.countdown.max_numbers={self.max_numbers}]")
        self._require("max_numbers", self.max_numbers <= min(8, self.max_number - 1),
                      "must be <= 8 and leave that many distinct numbers in [2, max_number]")
        self._require("max_number", self.max_number <= self.max_value,
                      f"must be <= config.task.countdown.max_value={self.max_value}")
        self._require("min_target", 1 <= self.min_target <= self.max_value,
                      f"must be in [1, config.task.countdown.max_value={self.max_value}]")
        self._positive("min_solutions", "num_train")


@dataclasses.dataclass(frozen=True)
class TaskConfig(Section):
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
    arith: ArithTaskConfig = dataclasses.field(default_factory=ArithTaskConfig)
    """The embedded `arith` task's generator settings."""
    countdown: CountdownTaskConfig = dataclasses.field(default_factory=CountdownTaskConfig)
    """The embedded `countdown` task's generator settings."""

    def check(self):
        self._registered("name", registry.TASKS)
        if self.eval_name:
            self._registered("eval_name", registry.TASKS)


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
