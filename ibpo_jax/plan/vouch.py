"""The continuation calls of `ibpo.operator=vouched_steps` (trainer/vouch.py), priced per call.

Each round of the operator's walk samples K = ibpo.completions continuations of wrong
responses' step prefixes, C prefixes a call (the rollout's chunk: rollout.sample_chunk, else
B), each prefix a prompt as wide as the rollout's prompt and response (P + R), decoding up to
R tokens: the sampler's own programs at those shapes, so the plan compiles them as a rollout of
C prompts x K, P + R wide (the one-pass sampler: the trainer's continuations use no slot
refill). Its KV cache is wider than the rollout's by C·R prompt tokens, so its peak counts
where the step fits. How many calls a step makes follows the data (the wrong responses, how
far each walk goes: on `countdown`, 4.5x a step's rollouts), so they count per call, with no
runs in the step's time (`runs` 0; the note says so).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ibpo_jax.core import comparison
from ibpo_jax.plan import programs as programs_lib

PREFIX = "vouch: "  # the names of its programs in the plan's table


def setup(s: programs_lib.Setup) -> programs_lib.Setup | None:
    """`s` whose step's rollout is one continuation call; None without `vouched_steps`."""
    cfg = s.cfg
    if cfg.ibpo.operator not in comparison.NEEDS_VOUCHED:
        return None
    r = cfg.rollout
    call = dataclasses.replace(r, prompts_per_step=r.sample_chunk or r.prompts_per_step,
                               sample_chunk=0, group_size=cfg.ibpo.completions,
                               max_prompt_len=r.max_prompt_len + r.max_new_tokens,
                               refill=False, partial=False)
    return dataclasses.replace(s, cfg=dataclasses.replace(cfg, rollout=call))


def programs(s: programs_lib.Setup, weights: Any, key: Any) -> list[programs_lib.Program]:
    """The continuation call's prefill and decode (named PREFIX + the sampler's names), from
    the rollout's weight copy; [] without `vouched_steps`."""
    v = setup(s)
    if v is None:
        return []
    c = programs_lib.sampler_calls(v.cfg)
    out = []
    for p in programs_lib.sample(v, programs_lib.generator(v), weights, key):
        out.append(dataclasses.replace(
            p, name=PREFIX + p.name, runs=0.0,
            note=f"{p.note}; per call of {c.prompts} prefixes x {c.samples}, "
                 f"{c.width} wide (as many a step as the data asks: not in the step's time)"))
    return out
