"""The countdown checker on hand-built responses: right ones, and the first wrong line of each
kind of mistake (arithmetic, unavailable number, a right-looking step that makes the target
unreachable, malformed lines, the answer line), and the reward built on it."""

import pytest

from ibpo_jax.data import countdown
from ibpo_jax.rewards import get_reward

# Make 42 from 2 3 7 9 (worked by hand): 7*3=21, 21*2=42; or 9-3=6, 7*6=42; ...
RECORD = {"id": "ex", "question": "Make 42 from 2 3 7 9.", "numbers": [2, 3, 7, 9],
          "target": 42, "max_value": 99, "num_solutions": 0, "reference": ""}


@pytest.mark.parametrize("response, correct, first_wrong, answer", [
    ("7*3=21\n21*2=42\nAnswer: 42", True, None, 42),
    ("7*3=21\n21*2=42\nAnswer: 42\n", True, None, 42),            # trailing newline
    ("9-3=6\n7*6=42\nAnswer: 42", True, None, 42),                # another solution
    ("3*7=21\n2*21=42\nAnswer: 42", True, None, 42),              # smaller operand first
    ("9+7=16\n16-2=14\n14*3=42\nAnswer: 42", True, None, 42),     # every number but one
    ("9-2=7\n7+7=14\n14*3=42\nAnswer: 42", True, None, 42),      # both 7s: given and made
    ("9-2=7\n7*7=49\n49-7=42\nAnswer: 42", False, 1, 42),         # then 42 is out of reach
    ("9-2=7\n2*3=6\n7*6=42\nAnswer: 42", False, 1, 42),           # 2 already used
    ("7*3=22\n22*2=44\nAnswer: 44", False, 0, 44),                # wrong arithmetic
    ("7*3=21\n21*2=43\nAnswer: 43", False, 1, 43),                # wrong arithmetic, later
    ("7*5=35\n35+7=42\nAnswer: 42", False, 0, 42),                # 5 is not given
    ("7*3=21\n21*3=63\nAnswer: 63", False, 1, 63),                # 3 already used
    ("3-2=1\n9*7=63\nAnswer: 63", False, 0, 63),                  # right, but 42 unreachable
    ("9/2=4\n4*7=28\nAnswer: 28", False, 0, 28),                  # inexact division
    ("2-3=1\n7*9=63\nAnswer: 63", False, 0, 63),                  # negative result
    ("7 * 3 = 21\n21*2=42\nAnswer: 42", False, 0, 42),            # spaces: malformed
    ("7*3=21\nhmm\n21*2=42\nAnswer: 42", False, 1, 42),           # malformed line
    ("7*3=21\n\n21*2=42\nAnswer: 42", False, 1, 42),              # blank line
    ("7*3=021\n21*2=42\nAnswer: 42", False, 0, 42),               # leading zero
    ("7*3=21\n21*2=42\nAnswer: 41", False, 2, 41),                # answer line wrong
    ("7*3=21\n21*2=42\nThe answer is 42", False, 2, None),        # malformed answer line
    ("7*3=21\nAnswer: 42", False, 1, 42),                          # answer before reaching it
    ("Answer: 42", False, 0, 42),                                  # no steps at all
    ("7*3=21\n21*2=42\nAnswer: 42\n9-3=6", False, 3, 42),         # a line after the answer
    ("7*3=21\n21*2=42", False, None, None),                       # truncated
    ("", False, None, None),
])
def test_check_hand_built(response, correct, first_wrong, answer):
    verdict = countdown.check(response, RECORD)
    assert (verdict.correct, verdict.first_wrong_step, verdict.answer) == (
        correct, first_wrong, answer), verdict.reason
    if first_wrong is not None:
        assert verdict.reason.startswith(f"step {first_wrong}:")
    elif not correct:
        assert verdict.reason.startswith("incomplete")


def test_reasons_name_the_mistake():
    def reason(response):
        return countdown.check(response, RECORD).reason

    assert "wrong arithmetic" in reason("7*3=22")
    assert "not available" in reason("7*5=35") and "left: 2 3 7 9" in reason("7*5=35")
    assert "42 can no longer be reached" in reason("3-2=1")
    assert "breaks the rules" in reason("9/2=4")
    assert "malformed" in reason("hmm")
    assert "not the target" in reason("Answer: 41")
    assert "before reaching it" in reason("Answer: 42")


def test_the_cap_on_results_is_a_rule():
    # 9*7*2 = 126 > max_value 99: a step past the cap is wrong even though its arithmetic is.
    verdict = countdown.check("9*7=63\n63*2=126\n126/3=42\nAnswer: 42", RECORD)
    assert (verdict.correct, verdict.first_wrong_step) == (False, 1)
    raised = countdown.check("9*7=63\n63*2=126\n126/3=42\nAnswer: 42",
                             {**RECORD, "max_value": 200})
    assert raised.correct and raised.first_wrong_step is None


def test_reward_reports_the_verdict_and_first_wrong_step():
    reward = get_reward("countdown")
    good = reward(RECORD, "9-3=6\n7*6=42\nAnswer: 42")
    bad = reward(RECORD, "3-2=1\n9*7=63\nAnswer: 63")
    assert (good.reward, good.info["first_wrong_step"]) == (1.0, None)
    assert (bad.reward, bad.info["first_wrong_step"]) == (-1.0, 0)
    assert "no longer be reached" in bad.info["reason"]
