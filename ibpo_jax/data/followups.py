"""Second-round prompts, one template per task family (the task's reward name): Appendix B's
corrections (DESIGN §6: the problem, a wrong response and a correct response of its group)
and SCoRe's second attempts (DESIGN §7: the problem, the first attempt and a fixed
self-correction instruction). The filled template is the user message; the task's `wrap`
applies its chat template (the identity for the embedded task). The README shows them."""

from __future__ import annotations

from ibpo_jax.data.tasks import MATH_INSTRUCTION, Task

# Braces doubled: the tails are part of str.format templates.
_MATH_CODE_TAIL = {"math": MATH_INSTRUCTION.replace("{", "{{").replace("}", "}}"),
                   "code": "Put the complete program in a single ```python code block at the "
                           "end of your response."}

# The embedded task's prompts end with a newline so the model continues with the first step.
CORRECTION = {
    "arith": "{question}\nA wrong solution:\n{wrong}\nA right solution:\n{right}\n"
             "Solve it again:\n",
    **{family: "{question}\n\nAn incorrect solution:\n\n{wrong}\n\nA correct solution:\n\n"
               "{right}\n\nFind where the incorrect solution goes wrong, then write a complete "
               "correct solution of your own. " + tail
       for family, tail in _MATH_CODE_TAIL.items()},
}
RETRY = {
    "arith": "{question}\nFirst attempt:\n{attempt}\nCheck each step and solve it again:\n",
    **{family: "{question}\n\nYour previous attempt:\n\n{attempt}\n\nThere might be an error in "
               "the solution above because of a lack of understanding of the question. Please "
               "correct the error, if any, and rewrite the solution. " + tail
       for family, tail in _MATH_CODE_TAIL.items()},
}


def _template(table: dict[str, str], task: Task, what: str) -> str:
    if task.reward not in table:
        raise ValueError(f"task {task.name!r} (reward {task.reward!r}) has no {what} template; "
                         f"families with one: {', '.join(table)}")
    return table[task.reward]


def correction_prompt(task: Task, record: dict, *, wrong: str, right: str) -> str:
    """The correction input of DESIGN §6 for a wrong response and a correct one of its group."""
    text = _template(CORRECTION, task, "correction").format(
        question=task.question(record), wrong=wrong, right=right)
    return task.wrap(text)


def retry_prompt(task: Task, record: dict, *, attempt: str) -> str:
    """SCoRe's second-attempt input (DESIGN §7) after the first attempt `attempt`."""
    text = _template(RETRY, task, "self-correction").format(
        question=task.question(record), attempt=attempt)
    return task.wrap(text)
