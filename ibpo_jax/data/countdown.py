"""The embedded task `countdown`: reach a target from a few numbers, where right solutions differ.

A problem is 4-6 distinct numbers (sorted) and a target, e.g.

    question:  "Make 42 from 3 5 7 9."
    reference: "9-3=6\\n7*6=42\\nAnswer: 42"  (or "9+5=14\\n14*3=42\\nAnswer: 42", ...)

Rules (the generator, the counts and the checker use the same ones): a line "a<op>b=c" takes two
numbers that are available (each given number and each earlier result can be used once), op is
one of + - * /, and c must be a positive integer no larger than `max_value` (division exact).
Not every number has to be used. A response is right when every line is right and its last line
is "Answer: N" with N the target, reached by the lines before it.

Unlike `arith`, whose problems have exactly one right solution text, every problem kept here has
at least `min_solutions` distinct shortest solutions. A solution is an expression tree over a
subset of the numbers, + and * unordered ("5+3" and "3+5" are one solution, and so are two
texts with the same steps in another order); the shortest use the fewest steps (`num_steps`).
Records carry `num_solutions` (shortest) and `num_solutions_all` (any number of steps). The
reference is a shortest solution drawn uniformly at random, its steps in a random order among
those the tree allows, larger operand first: the supervised warm start sees a different one for
each problem, so the base's right answers in a group differ. Why the shortest: warm-started on
uniformly drawn solutions of any length (mostly trees over every number, 3-5 steps) the tiny
model solved under 1 % (0.75 % avg@8 after 400 steps); the shortest take 2-3 steps, like
`arith`'s chains, and there are still k of them.

Why not `reasoning-gym`'s countdown (PyPI, read for this): its problems must use every number,
draw 1..100 and targets 100..999 (far beyond a char-level tiny model), give one solution as a
single expression (not one step per line), count no solutions, and pull in sympy and a dozen
pinned packages. The generator here is small, counts solutions exactly (a subset DP over value
vectors, `solution_counts`), and draws from `random.Random.random()` only, whose stream Python
guarantees across versions.

`check` is the step-level ground truth (same verdict type as `arith.check`): the first wrong
line is the first one that is malformed, uses a number that is not available, has wrong
arithmetic or breaks the rules, or after which the target can no longer be reached with the
numbers left (exact search, `reachable`), or a wrong / premature answer line, or a line after it.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import re
from collections import Counter
from typing import Any

import numpy as np

from ibpo_jax.config.schema import Section
from ibpo_jax.data.arith import StepCheck, draw_distinct

CountdownCheck = StepCheck  # one verdict type, so the probes read both tasks' checkers alike

_NUM = r"(0|[1-9]\d*)"  # no sign, no leading zeros: exactly how the reference writes numbers
_STEP_RE = re.compile(rf"{_NUM}([+\-*/]){_NUM}={_NUM}")
_ANSWER_RE = re.compile(rf"Answer: {_NUM}")
OPS = "+-*/"
_TABLE_OPS = "+*-/"  # the rows of `_op_tables`
NUM_TRAIN = 10000  # problems in the default training split (the defaults allow about 40,000)


@dataclasses.dataclass(frozen=True)
class CountdownConfig:
    """Difficulty knobs of `countdown`.

    min_numbers, max_numbers: how many numbers a problem gives (2 <= min <= max <= 8).
    max_number: the numbers are distinct integers in [2, max_number] (no 1: x*1 and x/1 would
      multiply the solutions without adding any real one).
    max_value: every result and the target are integers in [1, max_value].
    min_target: the target is at least this (and never one of the numbers).
    min_solutions: keep only problems with at least this many distinct shortest solutions.
    """

    min_numbers: int = 4
    max_numbers: int = 6
    max_number: int = 12
    max_value: int = 99
    min_target: int = 10
    min_solutions: int = 3

    def __post_init__(self):
        if not 2 <= self.min_numbers <= self.max_numbers <= 8:
            raise ValueError("CountdownConfig: need 2 <= min_numbers <= max_numbers <= 8, got "
                             f"{self.min_numbers}..{self.max_numbers}")
        if self.max_number - 1 < self.max_numbers:
            raise ValueError(f"CountdownConfig.max_number={self.max_number} leaves fewer than "
                             f"max_numbers={self.max_numbers} distinct numbers in [2, max_number]")
        if not (self.max_number <= self.max_value and 1 <= self.min_target <= self.max_value):
            raise ValueError(f"CountdownConfig: need max_number <= max_value and min_target in "
                             f"[1, max_value], got {self.max_number}, {self.min_target}, "
                             f"{self.max_value}")
        if self.min_solutions < 1:
            raise ValueError(f"CountdownConfig.min_solutions must be >= 1, got "
                             f"{self.min_solutions}")


def _randint(rng: random.Random, lo: int, hi: int) -> int:
    """Uniform integer in [lo, hi] built from `random()` only (version-stable stream)."""
    return lo + min(int(rng.random() * (hi - lo + 1)), hi - lo)


def apply(op: str, a: int, b: int, max_value: int) -> int | None:
    """a op b under the rules (a positive integer <= max_value, exact division), else None."""
    if op == "+":
        c = a + b
    elif op == "-":
        c = a - b
    elif op == "*":
        c = a * b
    elif b == 0 or a % b:
        return None
    else:
        c = a // b
    return c if 1 <= c <= max_value else None


@functools.lru_cache(maxsize=1 << 16)
def reachable(numbers: tuple[int, ...], target: int, max_value: int) -> bool:
    """Whether `target` is one of `numbers` (sorted) or the result of some sequence of steps
    on them (exact depth-first search, memoized on the sorted multiset)."""
    if target in numbers:
        return True
    n = len(numbers)
    for i in range(n):
        for j in range(i + 1, n):
            a, b = numbers[j], numbers[i]  # a >= b: the only order - and / can take
            rest = numbers[:i] + numbers[i + 1:j] + numbers[j + 1:]
            results = {apply(op, a, b, max_value) for op in OPS}
            for c in results - {None}:
                if reachable(tuple(sorted((*rest, c))), target, max_value):
                    return True
    return False


@functools.cache
def _op_tables(max_value: int) -> tuple[np.ndarray, np.ndarray]:
    """(results [4, V, V], valid [4, V, V]) over operand values 0..max_value, one row per op:
    +, *, the difference |a-b| and the exact quotient of the larger by the smaller, so one
    unordered pair of subtrees gives at most one tree per op (a == b divides once, to 1)."""
    v = np.arange(max_value + 1)
    a, b = v[:, None], v[None, :]
    hi, lo = np.maximum(a, b), np.maximum(np.minimum(a, b), 1)
    results = np.stack([a + b, a * b, hi - np.minimum(a, b), hi // lo])
    positive = (a >= 1) & (b >= 1)
    valid = np.stack([positive, positive, positive & (a != b), positive & (hi % lo == 0)])
    valid &= (results >= 1) & (results <= max_value)
    return np.where(valid, results, 0), valid


def _splits(mask: int):
    """Unordered splits {A, B} of a bitmask (A holds the lowest bit, B non-empty)."""
    low = mask & -mask
    rest = mask ^ low
    sub = rest
    while True:
        a = low | (rest ^ sub)  # every subset of `rest` goes into A or B
        if sub:
            yield a, sub
        if sub == 0:
            break
        sub = (sub - 1) & rest


def solution_counts(numbers: list[int], max_value: int) -> dict[int, np.ndarray]:
    """{subset bitmask: int64 [max_value + 1]}: how many expression trees over exactly that
    subset of `numbers` (distinct) evaluate to each value under the rules."""
    results, valid = _op_tables(max_value)
    counts = {}
    for i, x in enumerate(numbers):
        counts[1 << i] = np.zeros(max_value + 1, np.int64)
        counts[1 << i][x] = 1
    for mask in sorted(range(1, 1 << len(numbers)), key=lambda m: bin(m).count("1")):
        if mask & (mask - 1) == 0:
            continue
        total = np.zeros(max_value + 1, np.int64)
        for a, b in _splits(mask):
            ia, ib = np.flatnonzero(counts[a]), np.flatnonzero(counts[b])
            if not (len(ia) and len(ib)):
                continue
            pairs = np.outer(counts[a][ia], counts[b][ib])  # trees per (value a, value b)
            ok = valid[:, ia[:, None], ib[None, :]]
            vals = results[:, ia[:, None], ib[None, :]]
            total += np.bincount(vals[ok], weights=np.broadcast_to(pairs, ok.shape)[ok],
                                 minlength=max_value + 1).astype(np.int64)
        counts[mask] = total
    return counts


def _pick(rng: random.Random, weights: list[int]) -> int:
    """An index drawn with probability proportional to the (non-negative integer) weights."""
    x = _randint(rng, 0, sum(weights) - 1)
    for k, w in enumerate(weights):
        if x < w:
            return k
        x -= w
    raise AssertionError("unreachable")


def _sample_tree(counts: dict, mask: int, value: int, max_value: int,
                 rng: random.Random) -> list[tuple[int, str, int, int, list]]:
    """A uniformly random tree over `mask` with `value`, as its steps [(a, op, b, c, deps)]
    in post-order; deps are the indices of the steps that made a and b."""
    if mask & (mask - 1) == 0:
        return []
    results, valid = _op_tables(max_value)
    options, weights = [], []
    for a_mask, b_mask in _splits(mask):  # trees per (split, op, value a, value b)
        ia, ib = np.flatnonzero(counts[a_mask]), np.flatnonzero(counts[b_mask])
        hit = (valid & (results == value))[:, ia[:, None], ib[None, :]]
        w = np.where(hit, np.outer(counts[a_mask][ia], counts[b_mask][ib]), 0)
        for k, i, j in zip(*np.nonzero(w)):
            options.append((a_mask, b_mask, _TABLE_OPS[k], int(ia[i]), int(ib[j])))
            weights.append(int(w[k, i, j]))
    a_mask, b_mask, op, x, y = options[_pick(rng, weights)]
    left = _sample_tree(counts, a_mask, x, max_value, rng)
    right = _sample_tree(counts, b_mask, y, max_value, rng)
    shift = len(left)
    right = [(p, o, q, r, [d + shift for d in deps]) for p, o, q, r, deps in right]
    deps = [d for d, sub in ((len(left) - 1, left), (len(left) + len(right) - 1, right)) if sub]
    return [*left, *right, (max(x, y), op, min(x, y), value, deps)]


def _random_order(steps: list[tuple], rng: random.Random) -> list[str]:
    """The tree's step lines in a random order in which every step comes after the steps it
    uses (each next step drawn uniformly among those ready)."""
    done, lines = set(), []
    while len(done) < len(steps):
        ready = [k for k, s in enumerate(steps) if k not in done and set(s[4]) <= done]
        k = ready[_randint(rng, 0, len(ready) - 1)]
        done.add(k)
        a, op, b, c, _ = steps[k]
        lines.append(f"{a}{op}{b}={c}")
    return lines


def question_text(numbers: list[int], target: int) -> str:
    """ "Make 42 from 3 5 7 9." """
    return f"Make {target} from {' '.join(map(str, numbers))}."


def counts_by_steps(counts: dict[int, np.ndarray]) -> np.ndarray:
    """int64 [num_numbers, max_value + 1]: row k counts the solutions of k steps (trees over
    k + 1 numbers) per value; row 0 marks the numbers themselves."""
    n = max(counts).bit_length()
    out = np.zeros((n, len(next(iter(counts.values())))), np.int64)
    for mask, c in counts.items():
        out[bin(mask).count("1") - 1] += c
    return out


def shortest(by_steps: np.ndarray, target: int) -> tuple[int, int, int]:
    """(fewest steps reaching `target`, how many solutions have that many, how many have any
    number); (0, 0, 0) when no solution of >= 1 step reaches it."""
    column = by_steps[1:, target]
    if not column.any():
        return 0, 0, 0
    steps = int(np.flatnonzero(column)[0]) + 1
    return steps, int(column[steps - 1]), int(column.sum())


def _sample(config: CountdownConfig, rng: random.Random) -> dict | None:
    """One problem (sorted numbers, target, solution counts, a random shortest solution), or
    None when the numbers drawn give no target with enough shortest solutions."""
    n = _randint(rng, config.min_numbers, config.max_numbers)
    pool = list(range(2, config.max_number + 1))
    numbers = sorted(pool.pop(_randint(rng, 0, len(pool) - 1)) for _ in range(n))
    counts = solution_counts(numbers, config.max_value)
    by_steps = counts_by_steps(counts)
    targets = [t for t in range(config.min_target, config.max_value + 1)
               if t not in numbers and shortest(by_steps, t)[1] >= config.min_solutions]
    if not targets:
        return None
    target = targets[_randint(rng, 0, len(targets) - 1)]
    steps, num_shortest, num_all = shortest(by_steps, target)
    return {"numbers": numbers, "target": target, "num_steps": steps,
            "num_solutions": num_shortest, "num_solutions_all": num_all,
            "reference": random_solution(counts, target, config.max_value, rng)}


def random_solution(counts: dict[int, np.ndarray], target: int, max_value: int,
                    rng: random.Random) -> str:
    """A solution text drawn uniformly among the shortest solutions that `counts`
    (solution_counts of the problem's numbers) holds for `target`, its steps in a random
    allowed order."""
    steps = shortest(counts_by_steps(counts), target)[0]
    if not steps:
        raise ValueError(f"countdown: no solution reaches {target}")
    masks = [m for m in sorted(counts) if bin(m).count("1") == steps + 1 and counts[m][target]]
    mask = masks[_pick(rng, [int(counts[m][target]) for m in masks])]
    lines = _random_order(_sample_tree(counts, mask, target, max_value, rng), rng)
    return "\n".join([*lines, f"Answer: {target}"])


def generate(
    config: CountdownConfig, seed: int | random.Random, n: int, *,
    exclude: frozenset[str] | set[str] = frozenset(), id_prefix: str = "",
) -> list[dict]:
    """n distinct problems (distinct question texts, none in `exclude`), deterministic in seed.

    Raises ValueError when the config's problem space is too small to supply n of them.
    """
    rng = seed if isinstance(seed, random.Random) else random.Random(seed)

    def record(problem: dict, question: str, id: str) -> dict:
        return {"id": id, "question": question, "max_value": config.max_value, **problem}

    return draw_distinct(
        lambda: _sample(config, rng), lambda p: question_text(p["numbers"], p["target"]),
        record, n, exclude=exclude, id_prefix=id_prefix,
        too_few=lambda k: f"countdown: could only draw {k} of {n} distinct problems for "
        f"{config}; lower the split sizes or min_solutions")


def prompt_text(record: dict) -> str:
    """The question followed by a newline, so the model continues with the first step."""
    return record["question"] + "\n"


def _step_error(line: str, pool: Counter, max_value: int) -> tuple[str | None, tuple]:
    """(what is wrong with step line `line` given the available numbers, or None; and its
    operands and result (a, b, c) when it is right)."""
    m = _STEP_RE.fullmatch(line)
    if m is None:
        return f"malformed line {line!r}", ()
    a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
    if pool[a] < 1 + (a == b) or pool[b] < 1:
        left = " ".join(map(str, sorted(pool.elements())))
        return f"{line} uses a number that is not available (left: {left})", ()
    value = apply(op, a, b, max_value)
    if value is None:
        return f"{line} breaks the rules (results are integers in [1, {max_value}])", ()
    if c != value:
        return f"{line} is wrong arithmetic", ()
    return None, (a, b, c)


def check(response_text: str, record: dict) -> StepCheck:
    """Step-level verdict on `response_text` for the problem `record` (see the module doc)."""
    target, max_value = int(record["target"]), int(record["max_value"])
    text = response_text[:-1] if response_text.endswith("\n") else response_text
    lines = text.split("\n") if text else []
    pool = Counter(int(x) for x in record["numbers"])

    answer, answered = None, False
    first_wrong, why = None, None
    for k, line in enumerate(lines):
        if answered:
            first_wrong, why = k, f"extra line after the answer {line!r}"
            break
        if (m := _ANSWER_RE.fullmatch(line)) is not None:
            answer, answered = int(m.group(1)), True
            if answer != target:
                first_wrong, why = k, f"answer {answer} is not the target {target}"
                break
            if pool[target] < 1:
                first_wrong, why = k, f"answer {answer} before reaching it"
                break
            continue
        error, step = _step_error(line, pool, max_value)
        if error is None:
            a, b, c = step
            pool -= Counter([a, b])
            pool[c] += 1
            if not reachable(tuple(sorted(pool.elements())), target, max_value):
                error = f"{line}: {target} can no longer be reached"
        if error is not None:
            first_wrong, why = k, error
            break

    correct = answered and first_wrong is None
    if first_wrong is not None:
        reason = f"step {first_wrong}: {why}"
    elif correct:
        reason = "correct"
    else:  # every line present is right, so the response stops before its answer line
        reason = f"incomplete: {len(lines)} steps and no answer line"
    if answer is None and lines and (m := _ANSWER_RE.fullmatch(lines[-1])):
        answer = int(m.group(1))
    return StepCheck(correct=correct, first_wrong_step=first_wrong, answer=answer, reason=reason)


def canonical_step(line: str) -> str:
    """A step line in one form per step (`Task.canonical_step`, the `peer_steps` operator):
    + and * written larger operand first ("3+5=8" and "5+3=8" are one step); any other line,
    the answer line included, as it is."""
    m = _STEP_RE.fullmatch(line)
    if m is None:
        return line
    a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), m.group(4)
    if op in "+*" and b > a:
        a, b = b, a
    return f"{a}{op}{b}={c}"


def solution_key(text: str) -> tuple[str, ...]:
    """What a solution is (module doc): its step lines in canonical form (`canonical_step`), as
    a sorted tuple (the order of the steps and the answer line do not matter)."""
    lines = text.strip("\n").split("\n")
    return tuple(sorted(canonical_step(x) for x in lines if _STEP_RE.fullmatch(x)))


def group_solution_stats(texts: list[str], correct: list[bool],
                         group_size: int) -> dict[str, float]:
    """Diversity of the right responses of groups of `group_size` consecutive responses, over
    the groups with at least one right response: the mean number of right responses, of
    distinct solutions among them (`solution_key`) and of distinct texts, and the fraction of
    groups with >= 2 right responses whose right responses are all one solution."""
    if len(texts) != len(correct) or len(texts) % group_size:
        raise ValueError(f"group_solution_stats: {len(texts)} texts, {len(correct)} verdicts, "
                         f"group_size {group_size}")
    right, solutions, distinct_texts, same = [], [], [], []
    for g in range(0, len(texts), group_size):
        group = [t for t, ok in zip(texts[g:g + group_size], correct[g:g + group_size]) if ok]
        if not group:
            continue
        right.append(len(group))
        solutions.append(len({solution_key(t) for t in group}))
        distinct_texts.append(len(set(group)))
        if len(group) >= 2:
            same.append(solutions[-1] == 1)
    mean = (lambda xs: float(np.mean(xs)) if xs else float("nan"))
    return {"groups_with_right": len(right), "right_per_group": mean(right),
            "distinct_solutions_per_group": mean(solutions),
            "distinct_texts_per_group": mean(distinct_texts),
            "frac_groups_one_solution": mean(same)}


# ---------------------------------------- the task's config section (its record: data/tasks.py)
_DEFAULTS = CountdownConfig()  # the generator's defaults are the section's


@dataclasses.dataclass(frozen=True)
class CountdownTaskConfig(Section):
    KEY = "task.countdown"
    min_numbers: int = _DEFAULTS.min_numbers
    """Fewest numbers a `countdown` problem gives (>= 2)."""
    max_numbers: int = _DEFAULTS.max_numbers
    """Most numbers a problem gives (<= 8)."""
    max_number: int = _DEFAULTS.max_number
    """The numbers are distinct integers in [2, max_number]."""
    max_value: int = _DEFAULTS.max_value
    """Every result and the target are integers in [1, max_value]."""
    min_target: int = _DEFAULTS.min_target
    """Smallest target (a target is never one of the numbers)."""
    min_solutions: int = _DEFAULTS.min_solutions
    """Keep only problems with at least this many distinct shortest solutions (k)."""
    num_train: int = NUM_TRAIN
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


def task_options(c: CountdownTaskConfig) -> dict[str, Any]:
    """The section's value -> the task's keyword arguments (`tasks.ProceduralTask.options`)."""
    return {"config": CountdownConfig(
        min_numbers=c.min_numbers, max_numbers=c.max_numbers, max_number=c.max_number,
        max_value=c.max_value, min_target=c.min_target, min_solutions=c.min_solutions),
        "num_train": c.num_train}
