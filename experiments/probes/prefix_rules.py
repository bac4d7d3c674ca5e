"""Where a response of the `prefix_credit` probe goes wrong, token by token: the probe's one
task-specific part (`Rule`, looked up by the task's reward, `rule_for`).

"Right so far" is a property of a token prefix, so of a node of the group's prefix trie: the
prefix can still be extended to a response the task's checker accepts. The first wrong token is
the first one after which it cannot; the checker's first wrong line must contain it (`truth`
counts the exceptions).
- `arith`: the right answer is unique (the reference, with or without a final newline, then
  EOS), so a prefix is right while it is a prefix of it.
- `countdown`: many right solutions. A prefix is right when every complete line in it is a
  line `countdown.check` accepts after the lines before it, and the partial line is a prefix of
  such a line (a step on available numbers with right arithmetic after which the target stays
  reachable, or the answer line once the target is reached); after a complete answer line only
  EOS (or one newline, then EOS) is right, and EOS only after it. The right next lines come
  from the checker itself (`check` on the lines so far plus each candidate), not a second one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ibpo_jax.data import countdown


class Rule(NamedTuple):
    """A task's right-prefix rule and its notion of one solution."""

    right_tokens: Callable[[Any, dict, list[int]], int]  # (tokenizer, record, ids incl. EOS) ->
    # how many leading tokens are right (len(ids) when all are: a right or cut-short response)
    solution: Callable[[Any, list[int]], Hashable]  # (tokenizer, a right response's ids) -> key
    solutions_are: str  # what distinct keys are, on the results page
    note: str  # how the right prefix is defined, on the page ("" for arith's, the first rule)


# ------------------------------------------------------------------------------ arith


def first_error(ids: Sequence[int], answers: Sequence[Sequence[int]]) -> int:
    """Tokens of `ids` before its first wrong one: its longest common prefix with any right
    answer (len(ids) when it is a prefix of one: a right or merely cut-short response)."""
    best = 0
    for a in answers:
        k, n = 0, min(len(ids), len(a))
        while k < n and ids[k] == a[k]:
            k += 1
        best = max(best, k)
    return best


def right_answers(tokenizer, record: dict) -> list[list[int]]:
    """The token sequences `arith.check` accepts for `record`: its reference, with or without a
    final newline, then EOS."""
    if "reference" not in record:
        raise ValueError(f"prefix_credit: task record {record.get('id')!r} has no 'reference' "
                         "(the arith rule needs an arith task, whose right answer is unique)")
    return [tokenizer.encode(record["reference"] + end) + [tokenizer.eos_id] for end in ("", "\n")]


ARITH = Rule(lambda tok, record, ids: first_error(ids, right_answers(tok, record)),
             lambda tok, ids: tuple(ids), "right answers", "")


# ------------------------------------------------------------------------------ countdown


@functools.lru_cache(maxsize=1 << 16)
def next_lines(numbers: tuple[int, ...], target: int, max_value: int,
               done: tuple[str, ...]) -> frozenset[str]:
    """The lines `countdown.check` accepts after the right lines `done`: every step on two
    numbers that may be available (the given ones and every number the lines so far write, a
    superset of what is left) and the answer line, kept where check finds no wrong line."""
    record = {"numbers": list(numbers), "target": target, "max_value": max_value}
    seen = sorted({*numbers, *(int(x) for line in done for x in re.findall(r"\d+", line))})
    lines = [f"Answer: {target}"] + [f"{a}{op}{b}={c}" for a in seen for b in seen
                                     for op in countdown.OPS
                                     if (c := countdown.apply(op, a, b, max_value)) is not None]
    return frozenset(x for x in lines if countdown.check(
        "\n".join([*done, x]), record).first_wrong_step is None)


def countdown_right_chars(text: str, ended: bool, record: dict) -> int:
    """How many leading symbols of text (+ EOS when `ended`) are right (module doc):
    len(text) + ended when all are."""
    key = (tuple(int(x) for x in record["numbers"]), int(record["target"]),
           int(record["max_value"]))
    answer, done, pos = f"Answer: {key[1]}", [], 0
    lines = text.split("\n")
    for k, line in enumerate(lines):
        last = k == len(lines) - 1
        if done and done[-1] == answer:  # after "Answer: T\n" only EOS
            return len(text) + ended if last and not line else pos
        valid = next_lines(*key, tuple(done))
        if line in valid and not last:
            done.append(line)
            pos += len(line) + 1
            continue
        if line in valid:  # the last line, complete: EOS only after the answer
            return len(text) + ended if line == answer or not ended else len(text)
        best = max((_common(line, v) for v in valid), default=0)
        if best < len(line):
            return pos + best
        return len(text) if last and not ended else pos + len(line)  # a proper prefix
    raise AssertionError("unreachable: the last line returns")


def _common(a: str, b: str) -> int:
    k, n = 0, min(len(a), len(b))
    while k < n and a[k] == b[k]:
        k += 1
    return k


def _pieces(tokenizer, ids: Sequence[int]) -> tuple[list[str], bool]:
    """(each token's text, ended with EOS): a special token other than EOS becomes "\\0",
    which no right line holds."""
    ended = bool(len(ids)) and int(ids[-1]) in tokenizer.eos_ids
    body = ids[:len(ids) - ended]
    return [tokenizer.decode([int(i)]) or "\0" for i in body], ended


def countdown_right_tokens(tokenizer, record: dict, ids: Sequence[int]) -> int:
    """`countdown_right_chars` in tokens: the token holding the first wrong character (EOS
    when the text is right but must not end there)."""
    pieces, ended = _pieces(tokenizer, ids)
    text = "".join(pieces)
    k = countdown_right_chars(text, ended, record)
    if k >= len(text):
        return len(pieces) + (k - len(text))
    return int(np.searchsorted(np.cumsum([len(p) for p in pieces]), k, side="right"))


COUNTDOWN = Rule(
    countdown_right_tokens,
    lambda tok, ids: countdown.solution_key(tok.decode(ids)),
    "right solutions",
    "On countdown many right solutions exist: a token is right so far when the text up to it "
    "can still be extended to one (every complete line is one `countdown.check` accepts after "
    "the lines before it, the partial line a prefix of such a line; `experiments/"
    "prefix_rules.py`), and distinct right solutions are `countdown.solution_key`s (the same "
    "steps in another order, or + and * with swapped operands, are one solution).")

RULES = {"arith": ARITH, "countdown": COUNTDOWN}  # by the task's reward (checker)


def rule_for(reward: str) -> Rule:
    if reward not in RULES:
        raise ValueError(f"prefix_credit: no right-prefix rule for reward {reward!r}; "
                         f"valid: {', '.join(RULES)}")
    return RULES[reward]


# ------------------------------------------------------------------------------ truth


class Truth(NamedTuple):
    right: np.ndarray  # [N, R] bool: before the first wrong token (correct rows: all)
    right_step: np.ndarray  # [N, R] bool: before the checker's first wrong line
    mismatch: int  # wrong rows whose first wrong token is not on the checker's wrong line
    off_reference: int  # correct rows that the rule does not find right throughout


def truth(tokenizer, records: list[dict], tokens: np.ndarray, lengths: np.ndarray,
          correct: np.ndarray, infos: list[dict], rule: Rule = ARITH) -> Truth:
    """Where each row goes wrong, by token (`rule`) and by the checker's line (tokens
    [N, R])."""
    n, r = tokens.shape
    delim = np.asarray(tokenizer.is_delim)[tokens].astype(int)
    line = np.cumsum(delim, axis=1) - delim  # a newline belongs to the line it ends
    raw = np.array([rule.right_tokens(tokenizer, records[i], tokens[i, :lengths[i]].tolist())
                    for i in range(n)], dtype=int).reshape(n)
    fe = np.where(correct, r, raw)
    right = np.arange(r)[None, :] < fe[:, None]
    step_ = np.array([-1 if i.get("first_wrong_step") is None else i["first_wrong_step"]
                      for i in infos])
    right_step = np.where((step_ >= 0)[:, None], line < step_[:, None], right)
    on_line = line[np.arange(n), np.minimum(fe, r - 1)]
    mismatch = ~correct & (step_ >= 0) & ((fe >= lengths) | (on_line != step_))
    off = correct & (raw < lengths)
    return Truth(right, right_step, int(mismatch.sum()), int(off.sum()))
