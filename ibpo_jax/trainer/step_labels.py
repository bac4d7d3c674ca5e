"""Host-side labels of a response's steps that two operators read (issue 57), computed from the
decoded texts the verifier scored:

- `truth_steps`: the checker's first wrong step (its reports' `first_wrong_step`, a line index)
  as a step index of the comparison (`units.split_steps`: a step is a maximal run of non-newline
  tokens, so empty lines are no steps), for `ibpo.operator = "checker"`;
- `canonical_ids`: one int32 id per step of the task's canonical form of the line
  (`Task.canonical_step`), for `ibpo.operator = "peer_steps"`.

Steps here are the text's non-empty lines, the comparison's steps on the device are runs of
non-delimiter tokens: the two agree whenever the tokenizer's newline tokens are exactly its
delimiters (the embedded tokenizer), and `credit` falls back to the hashed step units of a row
whose counts differ (logged as `canonical_fallback_frac`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ibpo_jax.config.sections import ConfigError, IbpoConfig
from ibpo_jax.core import comparison, units
from ibpo_jax.runtime import sharding
from ibpo_jax.trainer.batching import decode_responses


def step_lines(text: str) -> list[str]:
    """The steps of a response text: its non-empty lines, in order."""
    return [line for line in text.split("\n") if line]


def truth_steps(texts: Sequence[str], infos: Sequence[dict]) -> np.ndarray:
    """[n] int32: the step index of each response's first wrong line (the non-empty lines before
    it), -1 where the checker names none (right, or every line present is right)."""
    out = np.full(len(texts), -1, np.int32)
    for i, (text, info) in enumerate(zip(texts, infos, strict=True)):
        line = info.get("first_wrong_step")
        if line is not None:
            out[i] = sum(1 for x in text.split("\n")[: int(line)] if x)
    return out


def step_id(text: str) -> int:
    """A stable int32 id of a step's text (crc32; equal texts, equal ids)."""
    return int(np.uint32(zlib.crc32(text.encode())).view(np.int32))


def canonical_ids(texts: Sequence[str], canonical: Callable[[str], str], slots: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(ids [n, slots] int32, count [n] int32): the canonical form's id of each step of each
    text, the first `slots` steps (the comparison's unit budget), 0 past `count`."""
    ids = np.zeros((len(texts), slots), np.int32)
    count = np.zeros(len(texts), np.int32)
    for i, text in enumerate(texts):
        steps = [step_id(canonical(line)) for line in step_lines(text)][:slots]
        ids[i, : len(steps)] = steps
        count[i] = len(steps)
    return ids, count


def label(rollout: Any, got: Any, *, ibpo: IbpoConfig, task: Any, tokenizer: Any,
          mesh: Any) -> Any:
    """`rollout` with what the run's operator reads of its rows (unchanged for the others),
    from `got` (`dynamic.Sampled`: this process's rows, their verifier reports, the samples)."""
    needs_truth = ibpo.operator in comparison.NEEDS_TRUTH
    if not needs_truth and ibpo.operator != "peer_steps":
        return rollout
    tokens = sharding.local_rows(got.out.tokens)[1]  # the rows `got.rows`, in order
    texts = decode_responses(tokenizer, tokens, got.lengths[got.rows])
    place = lambda x: sharding.rows_array(x, got.rows, len(got.lengths),  # noqa: E731
                                          sharding.batch_sharding(mesh, np.ndim(x)))
    if needs_truth:
        return rollout._replace(step_truth=place(truth_steps(texts, got.infos)))
    if task.canonical_step is None or ibpo.granularity != "step":
        return rollout  # the steps as written: the hashed step units themselves
    slots = units.step_budget(tokens.shape[1], ibpo.max_units or None, "step_labels")
    ids, count = canonical_ids(texts, task.canonical_step, slots)
    return rollout._replace(step_ids=place(ids), step_ids_len=place(count))


def check_task(ibpo: IbpoConfig, task: Any) -> None:
    """One line when the run's operator needs what its task cannot give."""
    if ibpo.operator == "checker" and not task.checks_steps:
        raise ConfigError(f"config.ibpo.operator='checker': task {task.name!r} has no checker "
                          "that names the first wrong step (tasks that do: arith, countdown)")
