"""A procedural task in one module, as docs/extending.md describes: "Add a and b." problems,
solved in one step line and an answer line, with its generator, step checker, dataset builder,
config section and record. Importing it registers nothing: `register()` does (the test takes
it off again)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np

from ibpo_jax.config.schema import Section
from ibpo_jax.data import tasks
from ibpo_jax.data.arith import StepCheck, draw_distinct
from ibpo_jax.data.procedural_tfds import ProceduralBuilder, ProceduralBuilderConfig


def generate(top: int, seed: int, n: int, *, exclude=frozenset(), id_prefix: str = ""
             ) -> list[dict]:
    """n distinct problems with operands in [0, top]."""
    rng = random.Random(seed)

    def record(pair: tuple[int, int], question: str, id: str) -> dict:
        a, b = pair
        return {"id": id, "question": question, "reference": f"{a}+{b}={a + b}\nAnswer: {a + b}",
                "a": a, "b": b}

    return draw_distinct(lambda: (rng.randint(0, top), rng.randint(0, top)),
                         lambda pair: f"Add {pair[0]} and {pair[1]}.", record, n,
                         exclude=exclude, id_prefix=id_prefix, too_few=lambda k: f"toy: {k} of {n}")


def check(response: str, record: dict) -> StepCheck:
    """Right iff the step line and the answer line are; the first wrong line is named."""
    a, b = record["a"], record["b"]
    lines = response.strip().splitlines()
    expected = [f"{a}+{b}={a + b}", f"Answer: {a + b}"]
    for k, want in enumerate(expected):
        if k >= len(lines) or lines[k].strip() != want:
            return StepCheck(correct=False, first_wrong_step=k, answer=None,
                             reason=f"line {k}: expected {want!r}")
    return StepCheck(correct=True, first_wrong_step=None, answer=a + b, reason="correct")


class ToyBuilderConfig(ProceduralBuilderConfig):
    @classmethod
    def make(cls, top: int = 99, *, num_train: int = 64, num_validation: int = 16,
             num_test: int = 16, seed: int = 0) -> ToyBuilderConfig:
        return cls.named(f"top{top}", top, num_train=num_train, num_validation=num_validation,
                         num_test=num_test, seed=seed)


class IbpoToyAdd(ProceduralBuilder):
    """Tfds registers it as "ibpo_toy_add"."""

    BUILDER_CONFIGS = [ToyBuilderConfig.make()]
    FEATURES = {"a": np.int64, "b": np.int64}
    DESCRIPTION = "Add two numbers (a test's toy task)."
    generate = staticmethod(generate)


@dataclasses.dataclass(frozen=True)
class ToyAddConfig(Section):
    KEY = "task.toy_add"
    top: int = 99
    """Largest operand."""


def dataset(**kwargs) -> tuple[type, ToyBuilderConfig]:
    return IbpoToyAdd, ToyBuilderConfig.make(**kwargs)


def prompt_text(record: dict) -> str:
    return record["question"] + "\n"


def options(section: ToyAddConfig) -> dict:
    return {"top": section.top}


def register() -> tasks.ProceduralTask:
    return tasks.register_procedural(tasks.ProceduralTask(
        name="toy_add", dataset=dataset, prompt_text=prompt_text, check=check,
        section=ToyAddConfig, options=options))


def unregister() -> None:
    from ibpo_jax.config.registry import PROCEDURAL, REWARDS, TASKS

    for registry in (PROCEDURAL, REWARDS, TASKS):
        registry._entries.pop("toy_add", None)
