"""Tasks: what the trainer samples prompts from, how it words them, and which reward scores them.

`get_task(name, **kwargs)` looks `name` up in `registry.TASKS`:

  arith          the embedded procedural task (ibpo_jax.data.arith), TFDS/array_record backed
  countdown      embedded: reach a target from a few numbers, several right solutions each

A procedural task (generated, scored by its own step checker, read with the char tokenizer) is
one `ProceduralTask` record passed to `register_procedural`, which makes it a TASKS entry, a
REWARDS entry of its name and a `registry.PROCEDURAL` entry that the config (its section
`config.task.<name>`), the tokenizer choice, the plan and the second rounds read. `arith` and
`countdown` are registered below; a task of your own does the same from its own module
(tests/test_extending.py trains a toy one).
  math_jsonl     a generic RL training prompt file (prompt + answer, e.g. DeepScaleR, MATH train)
  math500, aime24, aime25, olympiadbench          math benchmarks from local files
  livecodebench, codeforces                       code benchmarks from local files

Real-data tasks read the user's downloaded files (no hub access): pass `path` (a file, a directory
of shards or a glob) for the task's default split, or `files={"train": ..., "test": ...}`, and
`fields={canonical: column}` when the columns are named differently (see formats.DEFAULT_FIELDS).
Prompts go through the chat template of `tokenizer` (an HFTokenizer; Qwen3's thinking switch is
`enable_thinking`) and ask for the final answer in \\boxed{} (math) or for one Python code block
(code). Without a tokenizer the prompt is the bare instruction text (for base models).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ibpo_jax.config.registry import PROCEDURAL, REWARDS, TASKS, UnknownSplitError
from ibpo_jax.data import arith, countdown, formats

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CODE_STDIO_INSTRUCTION = (
    "Write a Python 3 program that reads the input from standard input and writes the answer to "
    "standard output. Put the complete program in a single ```python code block at the end of "
    "your response.")
CODE_STARTER_INSTRUCTION = (
    "Complete the following starter code in Python 3 (keep the class and method names). Put the "
    "complete solution in a single ```python code block at the end of your response.")


@dataclasses.dataclass(frozen=True)
class Task:
    """A named task.

    name: the registry name.
    reward: the REWARDS name that scores its responses.
    splits: split name -> zero-argument loader returning a random-access sequence of
      plain-dict records (`len(src)`, `src[i]`; records are picklable). A loader reads its
      files on every call: keep the returned source.
    prompt_fn: record -> prompt text.
    reference_fn: record -> reference solution text, or None.
    question_fn: record -> the problem statement alone (what second-round prompts quote,
      `data.followups`).
    wrap_fn: a user message -> the model's prompt text (the chat template, or the identity).
    checks_steps: its reward's reports name the first wrong step (`first_wrong_step`, a line
      index), which `ibpo.operator = "checker"` reads.
    canonical_step: a step line -> its canonical form (`ibpo.operator = "peer_steps"` compares
      steps in it), or None: the step as written.
    """

    name: str
    reward: str
    splits: Mapping[str, Callable[[], Sequence[dict]]]
    prompt_fn: Callable[[dict], str]
    reference_fn: Callable[[dict], str | None]
    question_fn: Callable[[dict], str] = operator.itemgetter("question")
    wrap_fn: Callable[[str], str] = str
    checks_steps: bool = False
    canonical_step: Callable[[str], str] | None = None

    def split(self, name: str) -> Sequence[dict]:
        if name not in self.splits:
            # A benchmark's file is its one split ("test"): training on it is a choice to state.
            hint = (f"; to train on it, set config.task.train_split={next(iter(self.splits))}"
                    if len(self.splits) == 1 else "")
            raise UnknownSplitError(f"task {self.name!r} has no split {name!r}; available: "
                                    f"{sorted(self.splits)}{hint}")
        return self.splits[name]()

    def prompt_text(self, record: dict) -> str:
        return self.prompt_fn(record)

    def reference_text(self, record: dict) -> str | None:
        return self.reference_fn(record)

    def question(self, record: dict) -> str:
        return self.question_fn(record)

    def wrap(self, text: str) -> str:
        return self.wrap_fn(text)


def get_task(name: str, **kwargs) -> Task:
    """The task `name` (a TASKS entry) built with the task's keyword arguments."""
    return TASKS.get(name, key="task")(**kwargs)


@dataclasses.dataclass(frozen=True)
class ProceduralTask:
    """One procedural task.

    name: its TASKS / REWARDS / PROCEDURAL name, and its config section's (`task.<name>`).
    dataset: (**task keyword arguments: config, num_train, num_validation, num_test, seed) ->
      (its `procedural_tfds.ProceduralBuilder` subclass, the builder config); imports tfds.
    prompt_text: record -> prompt.
    check: (response text, record) -> verdict with `correct`, `reason`, `answer` and
      `first_wrong_step` (the line index of the first wrong step, or None), as `arith.check`.
    section: its config section, a `config.schema.Section` with KEY "task.<name>".
    options: (the section's value) -> the task keyword arguments `dataset` takes.
    canonical_step: a step line -> its canonical form (`ibpo.operator=peer_steps`), or None.
    correction, retry: the second rounds' templates (`data.followups`: Appendix B's
      corrections, SCoRe's retry), or None where the methods do not run on it.
    """

    name: str
    dataset: Callable[..., tuple[type, Any]]
    prompt_text: Callable[[dict], str]
    check: Callable[[str, dict], Any]
    section: type
    options: Callable[[Any], Mapping[str, Any]]
    canonical_step: Callable[[str], str] | None = None
    correction: str | None = None
    retry: str | None = None


@dataclasses.dataclass(frozen=True)
class StepChecked:
    """A procedural task's reward (picklable: reward workers are spawned): right iff its
    checker says so, the first wrong step in the info."""

    check: Callable[[str, dict], Any]

    def __call__(self, record: dict, response: str) -> tuple[bool, dict]:
        verdict = self.check(response, record)
        return verdict.correct, {"reason": verdict.reason, "answer": verdict.answer,
                                 "first_wrong_step": verdict.first_wrong_step}


def register_procedural(task: ProceduralTask) -> ProceduralTask:
    """Registers `task` as a task, a reward and a procedural task (see the module docstring)."""
    if task.section.KEY != f"task.{task.name}":
        raise ValueError(f"procedural task {task.name!r}: its section's KEY is "
                         f"{task.section.KEY!r}, not 'task.{task.name}'")
    PROCEDURAL.register(task.name)(task)
    TASKS.register(task.name)(functools.partial(build_procedural, task))
    REWARDS.register(task.name)(StepChecked(task.check))
    return task


def build_procedural(task: ProceduralTask, *, data_dir: str | None = None, **kwargs: Any) -> Task:
    """`task` over the three splits of its dataset (procedural_tfds, built on first use into
    data_dir), scored by its own reward, whose reports name the first wrong step."""
    from ibpo_jax.data import procedural_tfds  # tfds only when a procedural task is used

    builder_cls, builder_config = task.dataset(**kwargs)
    splits = {s: functools.partial(procedural_tfds.load_split, builder_cls, builder_config, s,
                                   data_dir) for s in ("train", "validation", "test")}
    return Task(name=task.name, reward=task.name, splits=splits, prompt_fn=task.prompt_text,
                reference_fn=operator.itemgetter("reference"), checks_steps=True,
                canonical_step=task.canonical_step)


def procedural_options(task: ProceduralTask, task_config: Any) -> dict[str, Any]:
    """The task keyword arguments of `task` under a run's `config.task` (its section there, or
    the section's defaults for a task registered after the config was assembled)."""
    section = getattr(task_config, task.name, None)
    return dict(task.options(section if isinstance(section, task.section) else task.section()))


def _arith_dataset(**kwargs: Any) -> tuple[type, Any]:
    from ibpo_jax.data import arith_tfds  # tfds only when the task is used

    return arith_tfds.IbpoArith, arith_tfds.ArithBuilderConfig.make(**kwargs)


def _countdown_dataset(**kwargs: Any) -> tuple[type, Any]:
    from ibpo_jax.data import countdown_tfds  # tfds only when the task is used

    return countdown_tfds.IbpoCountdown, countdown_tfds.CountdownBuilderConfig.make(**kwargs)


# The embedded task's second-round prompts end with a newline: the model continues with the
# first step.
register_procedural(ProceduralTask(
    name="arith", dataset=_arith_dataset, prompt_text=arith.prompt_text, check=arith.check,
    section=arith.ArithTaskConfig, options=arith.task_options,
    correction="{question}\nA wrong solution:\n{wrong}\nA right solution:\n{right}\n"
               "Solve it again:\n",
    retry="{question}\nFirst attempt:\n{attempt}\nCheck each step and solve it again:\n"))
register_procedural(ProceduralTask(
    name="countdown", dataset=_countdown_dataset, prompt_text=countdown.prompt_text,
    check=countdown.check, section=countdown.CountdownTaskConfig, options=countdown.task_options,
    canonical_step=countdown.canonical_step))


def _chat(text: str, tokenizer, enable_thinking: bool, system: str | None) -> str:
    if tokenizer is None:
        return text
    return tokenizer.chat_prompt(text, enable_thinking=enable_thinking, system=system)


def _math_prompt(record: dict, *, tokenizer, enable_thinking: bool, system: str | None) -> str:
    return _chat(f"{record['problem']}\n\n{MATH_INSTRUCTION}", tokenizer, enable_thinking, system)


def _code_prompt(record: dict, *, tokenizer, enable_thinking: bool, system: str | None) -> str:
    if record["starter_code"]:
        text = (f"{record['question']}\n\n{CODE_STARTER_INSTRUCTION}\n\n"
                f"```python\n{record['starter_code']}\n```")
    else:
        text = f"{record['question']}\n\n{CODE_STDIO_INSTRUCTION}"
    return _chat(text, tokenizer, enable_thinking, system)


def _math_question(record: dict) -> str:
    return record["problem"]


def _code_question(record: dict) -> str:
    if record["starter_code"]:
        return f"{record['question']}\n\n```python\n{record['starter_code']}\n```"
    return record["question"]


def _file_task(name: str, *, reward: str, default_split: str, prompt: Callable[..., str],
               reference: Callable[[dict], str | None], question: Callable[[dict], str]):
    """Registers a task over local files in the format `name` (formats.CONVERTERS)."""

    def make(*, path: str | None = None, files: Mapping[str, str] | None = None,
             fields: Mapping[str, str] | None = None, tokenizer=None,
             enable_thinking: bool = True, system: str | None = None) -> Task:
        if (path is None) == (files is None):
            raise ValueError(
                f"task {name!r}: give exactly one of path= (the {default_split} split) or "
                "files={split: path}")
        files = {default_split: path} if files is None else dict(files)
        splits = {s: functools.partial(formats.load_records, name, p, fields=fields)
                  for s, p in files.items()}
        prompt_fn = functools.partial(prompt, tokenizer=tokenizer,
                                      enable_thinking=enable_thinking, system=system)
        wrap_fn = functools.partial(_chat, tokenizer=tokenizer, enable_thinking=enable_thinking,
                                    system=system)
        return Task(name=name, reward=reward, splits=splits, prompt_fn=prompt_fn,
                    reference_fn=reference, question_fn=question, wrap_fn=wrap_fn)

    make.__name__ = make.__qualname__ = f"{name}_task"
    make.__doc__ = f"Task {name!r} over local files (default split {default_split!r})."
    TASKS.register(name)(make)


def _solution(record: dict) -> str | None:
    return record.get("solution")


def _no_reference(record: dict) -> None:
    return None


_file_task("math_jsonl", reward="math", default_split="train", prompt=_math_prompt,
           reference=_solution, question=_math_question)
for _name in ("math500", "aime24", "aime25", "olympiadbench"):
    _file_task(_name, reward="math", default_split="test", prompt=_math_prompt,
               reference=_solution, question=_math_question)
for _name in ("livecodebench", "codeforces"):
    _file_task(_name, reward="code", default_split="test", prompt=_code_prompt,
               reference=_no_reference, question=_code_question)
