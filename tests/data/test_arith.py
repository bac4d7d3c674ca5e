"""arith: generation (constraints, determinism, disjointness) and the step checker against
hand-worked responses."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibpo_jax.data import arith

# The issue's example, worked by hand: 37+48=85, 85-19=66, 66*2=132.
RECORD = arith.make_record(37, "+-*", [48, 19, 2], id="ex")
GOOD = "37+48=85\n85-19=66\n66*2=132\nAnswer: 132"


def test_issue_example_texts():
    assert RECORD["question"] == "Start with 37. Add 48. Subtract 19. Multiply by 2."
    assert RECORD["reference"] == GOOD
    assert RECORD["answer"] == 132
    assert arith.prompt_text(RECORD) == "Start with 37. Add 48. Subtract 19. Multiply by 2.\n"
    division = arith.make_record(84, "/", [3], id="d")
    assert division["question"] == "Start with 84. Divide by 3."
    assert division["reference"] == "84/3=28\nAnswer: 28"


@pytest.mark.parametrize("response, correct, first_wrong, answer", [
    (GOOD, True, None, 132),
    (GOOD + "\n", True, None, 132),                                      # trailing newline
    ("37+48=85\n85-19=67\n67*2=134\nAnswer: 134", False, 1, 134),         # wrong arithmetic
    ("37+48=85\n84-19=65\n65*2=130\nAnswer: 130", False, 1, 130),         # does not continue
    ("37+48=85\n85+19=104\n104*2=208\nAnswer: 208", False, 1, 208),       # wrong operation
    ("37+48=85\nhmm\n66*2=132\nAnswer: 132", True, 1, 132),               # malformed, lucky end
    ("37+48=85\n\n85-19=66\n66*2=132\nAnswer: 132", True, 1, 132),        # blank line
    ("37 + 48 = 85\n85-19=66\n66*2=132\nAnswer: 132", True, 0, 132),      # spaces: malformed
    ("37+48=085\n85-19=66\n66*2=132\nAnswer: 132", True, 0, 132),        # leading zero
    ("37+48=85\n85-19=66\n66*2=132\nAnswer: -132", False, 3, None),      # sign
    ("37+48=85\n85-19=66\n66*2=132\nAnswer: 131", False, 3, 131),         # wrong answer line
    ("37+48=85\n85-19=66\n66*2=132\nThe answer is 132", False, 3, None),  # malformed answer
    ("37+48=85\n85-19=66\n66*2=132\nAnswer: 132\nAnswer: 132", True, 4, 132),  # extra line
    ("37+48=86\n86-19=66\n66*2=132\nAnswer: 132", True, 0, 132),          # right answer, bad step
    ("Answer: 132", True, 0, 132),                                        # skipped every step
    ("37+48=85\n85-19=66", False, None, None),                            # truncated
    ("", False, None, None),
])
def test_check_hand_worked(response, correct, first_wrong, answer):
    verdict = arith.check(response, RECORD)
    assert (verdict.correct, verdict.first_wrong_step, verdict.answer) == (
        correct, first_wrong, answer), verdict.reason
    if first_wrong is not None:
        assert verdict.reason.split("step ")[1].startswith(str(first_wrong))
    elif not correct:
        assert verdict.reason.startswith("incomplete")


def _evaluate_question(question: str) -> tuple[int, list[int]]:
    """Independent evaluator: reads the English question and returns (answer, values)."""
    start = int(re.match(r"Start with (\d+)\.", question).group(1))
    value, values = start, [start]
    for word, n in re.findall(r"(Add|Subtract|Multiply by|Divide by) (\d+)\.", question):
        n = int(n)
        value = {"Add": value + n, "Subtract": value - n, "Multiply by": value * n,
                 "Divide by": value // n}[word]
        if word == "Divide by":
            assert values[-1] % n == 0, "division must be exact"
        values.append(value)
    return value, values


@pytest.mark.parametrize("level", sorted(arith.LADDER))
def test_ladder_levels_respect_their_config(level):
    cfg = arith.LADDER[level]
    records = arith.generate(cfg, seed=7, n=40)
    assert len({r["question"] for r in records}) == 40
    for r in records:
        answer, values = _evaluate_question(r["question"])
        assert answer == r["answer"]
        assert len(values) == cfg.num_steps + 1
        assert all(0 <= v <= cfg.max_value for v in values)
        assert set(r["ops"]) <= set(cfg.ops)
        assert 10 ** (cfg.digits - 1) <= r["start"] < 10 ** cfg.digits
        for op, b in zip(r["ops"], r["operands"], strict=True):
            if op in "+-":
                assert 10 ** (cfg.digits - 1) <= b < 10 ** cfg.digits
            else:
                assert 2 <= b <= cfg.mul_max
        assert arith.check(r["reference"], r).correct


def test_generate_is_deterministic_and_seed_dependent():
    cfg = arith.ArithConfig()
    a = arith.generate(cfg, 0, 30)
    assert a == arith.generate(cfg, 0, 30)
    assert [r["question"] for r in a] != [r["question"] for r in arith.generate(cfg, 1, 30)]


def test_generate_excludes_and_reports_small_spaces():
    cfg = arith.ArithConfig()
    first = arith.generate(cfg, 0, 20)
    second = arith.generate(cfg, 0, 20, exclude={r["question"] for r in first})
    assert not {r["question"] for r in first} & {r["question"] for r in second}
    # 1 step, one-digit start and addend with a sum <= 9: only 36 distinct questions exist.
    tiny = arith.ArithConfig(num_steps=1, digits=1, ops="+", max_value=9)
    assert len(arith.generate(tiny, 0, 36)) == 36
    with pytest.raises(ValueError, match="could only draw 36 of 37"):
        arith.generate(tiny, 0, 37)


@pytest.mark.parametrize("kwargs, culprit", [
    ({"num_steps": 0}, "num_steps"), ({"digits": 0}, "digits"), ({"ops": "+%"}, "ops"),
    ({"ops": "++"}, "ops"), ({"digits": 3, "max_value": 500}, "max_value"),
    ({"mul_max": 1}, "mul_max"),
])
def test_config_validation_names_the_field(kwargs, culprit):
    with pytest.raises(ValueError, match=culprit):
        arith.ArithConfig(**kwargs)


@settings(max_examples=60)
@given(seed=st.integers(0, 10**6), level=st.sampled_from(sorted(arith.LADDER)),
       data=st.data())
def test_corrupting_one_result_is_found_at_that_step(seed, level, data):
    record = arith.generate(arith.LADDER[level], seed, 1)[0]
    lines = record["reference"].split("\n")
    k = data.draw(st.integers(0, len(lines) - 1))
    head, value = lines[k].rsplit("=", 1) if k < len(lines) - 1 else lines[k].split(": ")
    lines[k] = f"{head}={int(value) + 1}" if k < len(lines) - 1 else f"{head}: {int(value) + 1}"
    verdict = arith.check("\n".join(lines), record)
    assert verdict.first_wrong_step == k
    assert verdict.correct == (k < len(lines) - 1)  # only the answer line decides `correct`
