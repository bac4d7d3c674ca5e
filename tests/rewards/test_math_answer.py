"""Math reward: answer extraction (nested braces, answer lines) and equivalence decisions."""

import threading

import pytest

from ibpo_jax.rewards import get_reward, math_answer
from ibpo_jax.rewards.math_answer import extract_answer, last_boxed, normalize

MATH = get_reward("math")


@pytest.mark.parametrize("text, expected", [
    ("so \\boxed{\\frac{\\sqrt{2}}{2}} done", "\\frac{\\sqrt{2}}{2}"),
    ("first \\boxed{1}, finally \\boxed{ \\{1, 2\\} }", "\\{1, 2\\}"),
    ("\\fbox{7}", "7"),
    ("\\boxed {x^{2}}", "x^{2}"),
    ("an unclosed \\boxed{3 at the end", None),
    ("\\boxed{4} then an unclosed \\boxed{5", "4"),
    ("no box", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_extract_answer_falls_back_to_the_answer_line():
    assert extract_answer("37+48=85\nAnswer: 85") == "85"
    assert extract_answer("Thinking...\nFinal Answer: $\\frac{1}{2}$.\n") == "\\frac{1}{2}"
    assert extract_answer("Answer: 1\nanswer: 2\n") == "2"
    assert extract_answer("\\boxed{3}\nAnswer: 4") == "3"  # a boxed answer wins
    assert extract_answer("I don't know.") is None


def test_normalize():
    assert normalize("$\\left( 1,\\dfrac{1}{2} \\right)$.") == "(1,\\frac{1}{2})"
    assert normalize("\\text{Evelyn}") == "evelyn"
    assert normalize("90^\\circ") == "90"


@pytest.mark.parametrize("gold, response, correct", [
    ("\\frac{1}{2}", "The answer is \\boxed{0.5}.", True),            # fraction vs decimal
    ("0.5", "\\boxed{\\frac12}", True),
    ("\\frac{3}{4}", "\\boxed{\\dfrac{3}{4}}", True),                  # \frac vs \dfrac
    ("\\frac{3}{4}", "\\boxed{\\frac{4}{3}}", False),
    ("12", "\\boxed{12 \\text{ cm}}", True),                           # units
    ("5\\text{ m/s}", "\\boxed{5}", True),
    ("(1,2]", "\\boxed{(1, 2]}", True),                                # intervals
    ("(1,2]", "\\boxed{[1,2]}", False),
    ("\\{1,2,3\\}", "\\boxed{\\{3,1,2\\}}", True),                     # sets
    ("\\{1,2,3\\}", "\\boxed{\\{1,2\\}}", False),
    ("1, 2", "\\boxed{2, 1}", True),                                   # multiple answers
    ("1, 2", "\\boxed{1}", False),
    ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\frac{1}{\\sqrt{2}}}", True),   # nested braces
    ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\frac{\\sqrt{3}}{2}}", False),
    ("132", "66*2=132\nAnswer: 132", True),                            # answer line
    ("\\text{Evelyn}", "\\boxed{\\text{Evelyn}}", True),               # string fallback
    ("\\text{Evelyn}", "\\boxed{\\text{Bob}}", False),
])
def test_equivalences(gold, response, correct):
    result = MATH({"answer": gold}, response)
    assert result.info["correct"] is correct, result.info["reason"]
    assert result.reward == (1.0 if correct else -1.0)


def test_no_answer_is_wrong_with_reason():
    result = MATH({"answer": "3"}, "I think it is three-ish")
    assert result.reward == -1.0
    assert result.info["reason"].startswith("no answer") and result.info["answer"] is None
    assert result.info["time_s"] >= 0


def test_fractional_time_limits_are_accepted():
    assert get_reward("math", timeout_s=0.5)({"answer": "1/2"}, "\\boxed{0.5}").info["correct"]


def test_values_mapping():
    zero_one = get_reward("math", values=(0.0, 1.0))
    assert zero_one({"answer": "2"}, "\\boxed{2}").reward == 1.0
    assert zero_one({"answer": "2"}, "\\boxed{3}").reward == 0.0


def test_math_verify_timeout_falls_back_to_strings(monkeypatch):
    from math_verify.errors import TimeoutException

    def slow(*args, **kwargs):
        raise TimeoutException("Operation timed out!")

    monkeypatch.setattr(math_answer, "verify", slow)
    hit = MATH({"answer": "\\dfrac{1}{2}"}, "\\boxed{\\frac{1}{2}}")
    assert hit.info["correct"] and "timed out" in hit.info["reason"]
    miss = MATH({"answer": "\\frac{1}{2}"}, "\\boxed{0.5}")
    assert not miss.info["correct"] and "timed out" in miss.info["reason"]


def test_works_outside_the_main_thread():
    out = []
    worker = threading.Thread(target=lambda: out.append(MATH({"answer": "1/2"}, "\\boxed{0.5}")))
    worker.start()
    worker.join()
    assert out[0].info["correct"], out[0].info["reason"]
