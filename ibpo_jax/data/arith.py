"""The embedded default task `arith`: procedurally generated, step-verifiable arithmetic chains.

A problem is a start number and a chain of operations, e.g.

    question:  "Start with 37. Add 48. Subtract 19. Multiply by 2."
    reference: "37+48=85\\n85-19=66\\n66*2=132\\nAnswer: 132"

The response format is exactly the reference format: one step per line "a<op>b=c" (no spaces,
non-negative integers), then a final line "Answer: N". The prompt is the question plus "\\n", so
the model starts with the first step.

Defaults keep it small enough for a tiny character-level model to learn on CPU in minutes:
3 steps, 2-digit operands for + and -, a single-digit multiplier (2..9) for * (so numbers stay
short), and every intermediate value in [0, max_value] = [0, 999]. `LADDER` lists a difficulty
ladder from two additions up to six steps with exact division; every level has far more than
the 21000 distinct problems its default splits need.

`check` is the step-level ground truth that the paper does not have: it returns whether the final
answer is right and the index of the first wrong line, so one can measure how often φ's alignment
(DESIGN §2) finds the true first error.

Step indexing: the response is split at "\\n" (a single trailing newline is ignored); line k is
step k (0-based), blank lines included (a blank line is a malformed step). With the char
tokenizer, whose only delimiter is "\\n", line k is exactly unit k of `granularity="step"` as long
as the comparison counts a step that consists of the delimiter alone as a unit.

Randomness uses only `random.Random(seed).random()`, whose stream Python guarantees across
versions, so a seed gives the same problems everywhere.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable
from typing import Any

from ibpo_jax.config.schema import Section

OP_WORDS = {"+": "Add {}.", "-": "Subtract {}.", "*": "Multiply by {}.", "/": "Divide by {}."}
_NUM = r"(0|[1-9]\d*)"  # no sign, no leading zeros: exactly how the reference writes numbers
_STEP_RE = re.compile(rf"{_NUM}([+\-*/]){_NUM}={_NUM}")
_ANSWER_RE = re.compile(rf"Answer: {_NUM}")


@dataclasses.dataclass(frozen=True)
class ArithConfig:
    """Difficulty knobs of `arith`.

    num_steps: operations per problem (>= 1).
    digits: digits of the start number and of the + / - operands (>= 1).
    ops: the operators to draw from, a string over "+-*/".
    max_value: every intermediate value stays in [0, max_value].
    mul_max: * and / use a single factor in [2, mul_max] (division is always exact).
    """

    num_steps: int = 3
    digits: int = 2
    ops: str = "+-*"
    max_value: int = 999
    mul_max: int = 9

    def __post_init__(self):
        if self.num_steps < 1:
            raise ValueError(f"ArithConfig.num_steps must be >= 1, got {self.num_steps}")
        if self.digits < 1:
            raise ValueError(f"ArithConfig.digits must be >= 1, got {self.digits}")
        if not self.ops or set(self.ops) - set(OP_WORDS) or len(set(self.ops)) != len(self.ops):
            raise ValueError(
                f"ArithConfig.ops must be distinct characters of '+-*/', got {self.ops!r}")
        if self.max_value < 10 ** self.digits - 1:
            raise ValueError(
                f"ArithConfig.max_value={self.max_value} is below the largest "
                f"{self.digits}-digit operand")
        if self.mul_max < 2:
            raise ValueError(f"ArithConfig.mul_max must be >= 2, got {self.mul_max}")


# Difficulty ladder, easiest first; "level3" is the default ArithConfig().
LADDER: dict[str, ArithConfig] = {
    "level0": ArithConfig(num_steps=2, digits=2, ops="+"),
    "level1": ArithConfig(num_steps=2, digits=2, ops="+-"),
    "level2": ArithConfig(num_steps=3, digits=2, ops="+-"),
    "level3": ArithConfig(),
    "level4": ArithConfig(num_steps=5, digits=2, ops="+-*"),
    "level5": ArithConfig(num_steps=6, digits=3, ops="+-*/", max_value=9999),
}


@dataclasses.dataclass(frozen=True)
class StepCheck:
    """Verdict on one response.

    correct: the final line is "Answer: N" with N the true answer.
    first_wrong_step: index of the first wrong line (malformed, not continuing from the previous
      result, not the question's operation, wrong arithmetic, wrong answer value, or a line after
      the answer), or None when every line present is right (a truncated response then has
      correct=False and first_wrong_step=None).
    answer: N from the final line, or None.
    reason: a short human-readable explanation.
    """

    correct: bool
    first_wrong_step: int | None
    answer: int | None
    reason: str


def _randint(rng: random.Random, lo: int, hi: int) -> int:
    """Uniform integer in [lo, hi] built from `random()` only (version-stable stream)."""
    return lo + min(int(rng.random() * (hi - lo + 1)), hi - lo)


def _apply(op: str, a: int, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a // b


def _operand_choices(op: str, value: int, config: ArithConfig) -> list[int] | range:
    """Operands of `op` that keep the result in [0, max_value] (division: exact only)."""
    lo, hi = 10 ** (config.digits - 1), 10**config.digits - 1
    if op == "+":
        return range(lo, min(hi, config.max_value - value) + 1)
    if op == "-":
        return range(lo, min(hi, value) + 1)
    if op == "*":
        top = config.mul_max if value == 0 else min(config.mul_max, config.max_value // value)
        return range(2, top + 1)
    return [d for d in range(2, config.mul_max + 1) if value % d == 0]


def _sample(config: ArithConfig, rng: random.Random) -> tuple[int, str, list[int]] | None:
    lo, hi = 10 ** (config.digits - 1), 10**config.digits - 1
    start = value = _randint(rng, lo, hi)
    ops, operands = [], []
    for _ in range(config.num_steps):
        valid = [op for op in config.ops if len(_operand_choices(op, value, config)) > 0]
        if not valid:
            return None  # dead end (e.g. only "-" left at a small value): resample
        op = valid[_randint(rng, 0, len(valid) - 1)]
        choices = _operand_choices(op, value, config)
        operand = choices[_randint(rng, 0, len(choices) - 1)]
        value = _apply(op, value, operand)
        ops.append(op)
        operands.append(operand)
    return start, "".join(ops), operands


def question_text(start: int, ops: str, operands: list[int]) -> str:
    """ "Start with 37. Add 48. Multiply by 2." """
    words = [OP_WORDS[op].format(b) for op, b in zip(ops, operands, strict=True)]
    return " ".join([f"Start with {start}.", *words])


def solve(start: int, ops: str, operands: list[int]) -> tuple[list[str], int]:
    """Returns (step lines "a<op>b=c", final value)."""
    lines, value = [], start
    for op, b in zip(ops, operands, strict=True):
        nxt = _apply(op, value, b)
        lines.append(f"{value}{op}{b}={nxt}")
        value = nxt
    return lines, value


def make_record(start: int, ops: str, operands: list[int], *, id: str) -> dict:
    """The plain-dict record of one problem (the schema of the `arith` splits)."""
    lines, answer = solve(start, ops, operands)
    return {
        "id": id,
        "question": question_text(start, ops, operands),
        "reference": "\n".join([*lines, f"Answer: {answer}"]),
        "start": start,
        "ops": ops,
        "operands": list(operands),
        "answer": answer,
    }


def generate(
    config: ArithConfig, seed: int | random.Random, n: int, *,
    exclude: frozenset[str] | set[str] = frozenset(), id_prefix: str = "",
) -> list[dict]:
    """n distinct problems (distinct question texts, none in `exclude`), deterministic in seed.

    Raises ValueError when the config's problem space is too small to supply n of them.
    """
    rng = seed if isinstance(seed, random.Random) else random.Random(seed)

    def record(sample: tuple[int, str, list[int]], question: str, id: str) -> dict:
        return make_record(*sample, id=id)

    return draw_distinct(
        lambda: _sample(config, rng), lambda s: question_text(*s), record, n, exclude=exclude,
        id_prefix=id_prefix, too_few=lambda k: f"arith: could only draw {k} of {n} distinct "
        f"problems for {config}; lower the split sizes or raise the difficulty")


def draw_distinct(sample: Callable[[], Any], question: Callable[[Any], str],
                  record: Callable[[Any, str, str], dict], n: int, *,
                  exclude: frozenset[str] | set[str], id_prefix: str,
                  too_few: Callable[[int], str]) -> list[dict]:
    """n records of distinct question texts (none in `exclude`) from `sample()` (None: a
    failed draw), built by `record(sample, question, id)`; raises ValueError(too_few(count
    drawn)) when 200 n + 1000 draws do not supply them. Shared by the procedural tasks."""
    seen = set(exclude)
    records: list[dict] = []
    attempts, budget = 0, 200 * n + 1000
    while len(records) < n:
        attempts += 1
        if attempts > budget:
            raise ValueError(too_few(len(records)))
        drawn = sample()
        if drawn is None:
            continue
        text = question(drawn)
        if text in seen:
            continue
        seen.add(text)
        records.append(record(drawn, text, f"{id_prefix}{len(records)}"))
    return records


def prompt_text(record: dict) -> str:
    """The question followed by a newline, so the model continues with the first step."""
    return record["question"] + "\n"


def check(response_text: str, record: dict) -> StepCheck:
    """Step-level verdict on `response_text` for the problem `record` (see StepCheck)."""
    ops, operands = record["ops"], list(record["operands"])
    true_answer = int(record["answer"])
    text = response_text[:-1] if response_text.endswith("\n") else response_text
    lines = text.split("\n") if text else []

    answer = None
    if lines and (m := _ANSWER_RE.fullmatch(lines[-1])):
        answer = int(m.group(1))
    correct = answer == true_answer

    first_wrong, why = None, None
    prev = int(record["start"])
    for k, line in enumerate(lines):
        if k < len(ops):
            m = _STEP_RE.fullmatch(line)
            if m is None:
                first_wrong, why = k, f"step {k}: malformed line {line!r}"
                break
            a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
            if a != prev:
                first_wrong, why = k, f"step {k}: starts from {a}, previous result is {prev}"
                break
            if (op, b) != (ops[k], operands[k]):
                first_wrong = k
                why = f"step {k}: applies {op}{b}, the question says {ops[k]}{operands[k]}"
                break
            if c != _apply(op, a, b):
                first_wrong, why = k, f"step {k}: {a}{op}{b}={c} is wrong arithmetic"
                break
            prev = c
        elif k == len(ops):
            m = _ANSWER_RE.fullmatch(line)
            if m is None:
                first_wrong, why = k, f"step {k}: expected the answer line, got {line!r}"
                break
            if int(m.group(1)) != prev:
                first_wrong, why = k, f"step {k}: answer {m.group(1)} != {prev}"
                break
        else:
            first_wrong, why = k, f"step {k}: extra line after the answer {line!r}"
            break

    if first_wrong is not None:
        reason = f"correct answer but {why}" if correct else why
    elif correct:
        reason = "correct"
    else:  # every line present is right, so the response stops before its answer line
        reason = f"incomplete: {len(lines)} of {len(ops)} steps and no answer line"
    return StepCheck(correct=correct, first_wrong_step=first_wrong, answer=answer, reason=reason)


# ---------------------------------------- the task's config section (its record: data/tasks.py)
_DEFAULTS = ArithConfig()  # the generator's defaults are the section's (a change there changes
# the runs' data; the section only names them as config keys)


@dataclasses.dataclass(frozen=True)
class ArithTaskConfig(Section):
    KEY = "task.arith"
    num_steps: int = _DEFAULTS.num_steps
    """Operations per problem of the embedded `arith` task."""
    digits: int = 1
    """Digits of the start number and of the + / - operands (the runs' own default: one digit,
    below the generator's `ArithConfig().digits`)."""
    ops: str = _DEFAULTS.ops
    """Operators to draw from: distinct characters of '+-*/'."""
    max_value: int = _DEFAULTS.max_value
    """Every intermediate value stays in [0, max_value]."""

    def check(self):
        self._positive("num_steps", "digits")
        self._require("max_value", self.max_value >= 10 ** self.digits - 1,
                      f"must be >= the largest {self.digits}-digit operand")
        self._require("ops", bool(self.ops) and not set(self.ops) - set("+-*/")
                      and len(set(self.ops)) == len(self.ops), "distinct characters of '+-*/'")


def task_options(c: ArithTaskConfig) -> dict[str, Any]:
    """The section's value -> the task's keyword arguments (`tasks.ProceduralTask.options`)."""
    return {"config": ArithConfig(c.num_steps, c.digits, c.ops, c.max_value)}
