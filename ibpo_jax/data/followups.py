"""Second-round prompts, one template per task family (the task's reward name; a procedural
task's own, in its record: `data.tasks`): Appendix B's
corrections (DESIGN §6: the problem, a wrong response and a correct response of its group)
and SCoRe's second attempts (DESIGN §7: the problem, the first attempt and a fixed
self-correction instruction). The filled template is the user message; the task's `wrap`
applies its chat template (the identity for the embedded task). The README shows them."""

from __future__ import annotations

from ibpo_jax.config.registry import PROCEDURAL
from ibpo_jax.data.tasks import MATH_INSTRUCTION, Task

# Braces doubled: the tails are part of str.format templates.
_MATH_CODE_TAIL = {"math": MATH_INSTRUCTION.replace("{", "{{").replace("}", "}}"),
                   "code": "Put the complete program in a single ```python code block at the "
                           "end of your response."}

CORRECTION = {
    **{family: "{question}\n\nAn incorrect solution:\n\n{wrong}\n\nA correct solution:\n\n"
               "{right}\n\nFind where the incorrect solution goes wrong, then write a complete "
               "correct solution of your own. " + tail
       for family, tail in _MATH_CODE_TAIL.items()},
}
RETRY = {
    **{family: "{question}\n\nYour previous attempt:\n\n{attempt}\n\nThere might be an error in "
               "the solution above because of a lack of understanding of the question. Please "
               "correct the error, if any, and rewrite the solution. " + tail
       for family, tail in _MATH_CODE_TAIL.items()},
}


def _template(kind: str, task: Task, what: str) -> str:
    """Task `task`'s `kind` ("correction" | "retry") template: its procedural record's, else its
    reward family's."""
    found = {n: getattr(PROCEDURAL.get(n), kind) for n in PROCEDURAL.names()}
    found = {**{n: t for n, t in found.items() if t}, **{"correction": CORRECTION,
                                                           "retry": RETRY}[kind]}
    if task.reward not in found:
        raise ValueError(f"task {task.name!r} (reward {task.reward!r}) has no {what} template; "
                         f"families with one: {', '.join(found)}")
    return found[task.reward]


def correction_prompt(task: Task, record: dict, *, wrong: str, right: str) -> str:
    """The correction input of DESIGN §6 for a wrong response and a correct one of its group."""
    text = _template("correction", task, "correction").format(
        question=task.question(record), wrong=wrong, right=right)
    return task.wrap(text)


def retry_prompt(task: Task, record: dict, *, attempt: str) -> str:
    """SCoRe's second-attempt input (DESIGN §7) after the first attempt `attempt`."""
    text = _template("retry", task, "self-correction").format(
        question=task.question(record), attempt=attempt)
    return task.wrap(text)
