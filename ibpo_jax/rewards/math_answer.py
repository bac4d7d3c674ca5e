"""Math answer reward: extract the final answer, check it with math-verify, fall back to strings.

Extraction: the content of the last \\boxed{...} (or \\fbox{...}; braces may nest), else the last
line of the form "Answer: ..." / "Final answer: ..." (the `arith` answer line, and what models
write without LaTeX). No answer -> wrong, reason "no answer".

Checking: `math_verify.parse` both sides wrapped in $...$ and `math_verify.verify(gold, pred)`
(the checker Hugging Face uses: fractions vs decimals, \\dfrac, units in \\text, intervals, sets,
comma-separated multiple answers as sets, symbolic equality), each with an integer-second time
limit. math-verify's limit is a SIGALRM, which only works in a process's main thread; elsewhere
it runs without one (the RewardPool's workers call rewards from their main thread). Whatever
math-verify cannot decide (parse failure, timeout, error), or rejects, is also compared as
normalized strings, so a textual answer ("\\text{Evelyn}") still matches.
"""

from __future__ import annotations

import math
import re
import threading

from math_verify import parse, verify
from math_verify.errors import TimeoutException

from ibpo_jax.config.registry import REWARDS

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_LINE_RE = re.compile(r"^\s*(?:final answer|answer)\s*[:：]\s*(.+?)\s*$",
                             re.IGNORECASE | re.MULTILINE)
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def last_boxed(text: str) -> str | None:
    """Content of the last closed \\boxed{...} (balanced braces): a trailing one that is never
    closed is skipped in favour of the one before it; None if no box is closed."""
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{" and text[i - 1] != "\\":
                depth += 1
            elif text[i] == "}" and text[i - 1] != "\\":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a response: last \\boxed{} content, else the last answer line."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    lines = _ANSWER_LINE_RE.findall(text)
    if lines:
        return lines[-1].rstrip(".").strip().strip("$").strip()
    return None


def normalize(answer: str) -> str:
    """A canonical string form for the fallback comparison (spacing, \\left/\\right, \\dfrac,
    degree signs, \\text wrappers, $ and a trailing period removed; lower case)."""
    s = _TEXT_RE.sub(r"\1", answer)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"),
                     ("\\tfrac", "\\frac"), ("^\\circ", ""), ("^{\\circ}", ""), ("\\%", ""),
                     ("%", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""),
                     ("\\ ", ""), ("\\$", ""), ("$", "")):
        s = s.replace(old, new)
    s = re.sub(r"\s+", "", s).rstrip(".")
    return s.lower()


def _math_verify(gold: str, pred: str, timeout_s: float) -> tuple[bool | None, str]:
    """(verdict, note): verdict None when math-verify could not decide."""
    # SIGALRM takes whole seconds and only works in the main thread.
    in_main = threading.current_thread() is threading.main_thread()
    limit = max(1, math.ceil(timeout_s)) if in_main else None
    try:
        gold_parsed = parse(f"${gold}$", parsing_timeout=limit, raise_on_error=True)
        pred_parsed = parse(f"${pred}$", parsing_timeout=limit, raise_on_error=True)
        if not gold_parsed or not pred_parsed:
            side = "gold answer" if not gold_parsed else "response answer"
            return None, f"math-verify could not parse the {side}"
        equal = verify(gold_parsed, pred_parsed, timeout_seconds=limit, raise_on_error=True)
        return bool(equal), "math-verify: " + ("equal" if equal else "not equal")
    except TimeoutException:
        return None, f"math-verify timed out after {limit} s"
    except Exception as e:  # noqa: BLE001 - any sympy failure just means "undecided"
        return None, f"math-verify failed ({type(e).__name__})"


@REWARDS.register("math")
def math_reward(record: dict, response: str, *, timeout_s: float = 5) -> tuple[bool, dict]:
    """Verifier for math tasks: record["answer"] (LaTeX) against the response's final answer."""
    pred = extract_answer(response)
    if pred is None:
        return False, {"reason": "no answer (no \\boxed{} and no answer line)", "answer": None}
    gold = str(record["answer"])
    verdict, note = _math_verify(gold, pred, timeout_s)
    if verdict:
        return True, {"reason": note, "answer": pred}
    if normalize(gold) == normalize(pred):
        return True, {"reason": f"{note}; normalized strings match", "answer": pred}
    return False, {"reason": f"{note}; normalized strings differ", "answer": pred}
