"""How many decode steps a rollout takes when responses end early (issue 59, item 4).

The plan's decode row is the worst case: every row runs to `max_new_tokens`. Real lengths
spread widely (a wrong answer often runs to the limit, a right one stops early), and what a
step costs then depends on how the sampler schedules its slots. Given the lengths of one
step's B x G responses, `schedules` counts, for `slots` decode slots (the rows of one sampler
call, `sample_chunk` x G):

- ``today``: the sampler as it is: the rows in calls of `slots`, each call decoding until its
  longest row ends (compaction shrinks the rows read, not the steps: `kv_cache.row_steps`);
- ``refill``: every slot busy: a row that ends hands its slot to the next waiting row (list
  scheduling in queue order), so the step takes about total tokens / slots steps;
- ``partial``: partial rollouts as built (trainer/partial.py), with refill: 2B prompts in
  flight decode in rounds of max_new_tokens / 4 tokens a row (each round a refill call of the
  fresh prompts' rows and one of the carried rows), and
  the step ends after the first round with B whole groups finished; the other rows carry over
  into the next step. The mean over a run in steady state (`PARTIAL_STEPS` steps, the first
  left out); the carried rows' prompts and prefixes each round re-encodes are counted
  (`reencoded_tokens`; the plan prices them at the prefill's rate).

Every row's first token comes from its prompt's prefill, as in the sampler; decode steps and
slot-steps count the decode loop's, which makes the other `length - 1` tokens of each row. A
slot-step is one slot for one decode step; the wasted ones decode no token of any response (a
finished row's slot while its call runs on). Lengths come from `paper_mix` (stated below) or
`from_metrics` (a run's `metrics.jsonl`); decode time is decode steps times the plan's roofline
time of one decode step with every slot busy (decode is bound by reading the weights).
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path
from typing import Any

import numpy as np

PARTIAL_STEPS = 9  # steps simulated for partial rollouts (the first, a cold start, left out)
# The paper-like default: what fraction of responses is right, and the length quantiles of each
# kind as fractions of max_new_tokens (a log-normal between them: `_lognormal_quantiles`).
PAPER_ACCURACY = 0.4
PAPER_RIGHT = (0.08, 0.35)  # right answers: median 8 % of the limit, 95th percentile 35 %
PAPER_WRONG_TRUNCATED = 0.5  # half the wrong ones run to the limit (no final answer)
PAPER_WRONG = (0.25, 0.9)  # the other wrong ones: median 25 %, 95th percentile 90 %


def _lognormal_quantiles(n: int, median: float, p95: float) -> np.ndarray:
    """n evenly spaced quantiles ((i + 0.5) / n) of the log-normal with this median and 95th
    percentile: a deterministic sample, no random draw."""
    from statistics import NormalDist

    sigma = np.log(p95 / median) / NormalDist().inv_cdf(0.95)
    z = np.array([NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)])
    return median * np.exp(sigma * z)


def _interleave(parts: list[np.ndarray], rows: int) -> np.ndarray:
    """The parts' lengths spread through the rows in a fixed shuffled order (seed 0), as a
    step's groups mix right and wrong answers."""
    out = np.concatenate(parts)[:rows]
    return out[np.random.default_rng(0).permutation(len(out))]


def paper_mix(rows: int, max_new_tokens: int) -> np.ndarray:
    """[rows] response lengths of the paper-like default: `PAPER_ACCURACY` of the responses
    right, log-normal around 8 % of the limit; of the wrong ones `PAPER_WRONG_TRUNCATED` at the
    limit, the others log-normal around 25 %. An assumption in the shape of long-reasoning RL
    runs (short right answers, long or unfinished wrong ones), not a measurement."""
    right = round(rows * PAPER_ACCURACY)
    cut = round((rows - right) * PAPER_WRONG_TRUNCATED)
    other = rows - right - cut
    n = max_new_tokens
    ended = [_lognormal_quantiles(right, *(f * n for f in PAPER_RIGHT)),
             _lognormal_quantiles(other, *(f * n for f in PAPER_WRONG))]
    ended = [np.clip(np.round(p), 1, n - 1).astype(int) for p in ended]  # they end early
    return _interleave([ended[0], np.full(cut, n), ended[1]], rows)


def from_metrics(path: str | Path, rows: int, max_new_tokens: int, last: int = 10
                 ) -> np.ndarray:
    """[rows] lengths matching a run's `metrics.jsonl` (mean of its last `last` rows): a
    fraction `frac_truncated` at the limit, the others exponential with the mean that leaves
    `response_len_mean` overall. Raises ValueError naming the file when it has neither."""
    logged = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    logged = [r for r in logged if "response_len_mean" in r and "frac_truncated" in r][-last:]
    if not logged:
        raise ValueError(f"{path}: no row with response_len_mean and frac_truncated")
    n = max_new_tokens
    mean = float(np.mean([r["response_len_mean"] for r in logged]))
    cut_frac = float(np.mean([r["frac_truncated"] for r in logged]))
    cut = round(rows * cut_frac)
    rest = max((mean - cut_frac * n) / max(1 - cut_frac, 1e-9), 1.0)
    q = (np.arange(rows - cut) + 0.5) / max(rows - cut, 1)
    others = np.clip(np.round(-rest * np.log1p(-q)), 1, n - 1).astype(int)
    return _interleave([np.full(cut, n), others], rows)


def _refill(queue: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """List scheduling: (start step, end step) of each queued row when a free slot takes the
    next row at once."""
    free = [0] * min(slots, len(queue))
    start = np.zeros(len(queue), int)
    for i, length in enumerate(queue):
        start[i] = heapq.heappop(free)
        heapq.heappush(free, start[i] + int(length))
    return start, start + queue


def today(lengths: np.ndarray, slots: int, max_new_tokens: int, compact: bool) -> dict:
    """The sampler as it is: calls of `slots` rows, each until its longest row ends."""
    from ibpo_jax.models import kv_cache
    from ibpo_jax.sampler import sampling

    steps = row_steps = 0
    for i in range(0, len(lengths), slots):
        call = lengths[i:i + slots]
        rs, st = kv_cache.row_steps(call, max_new_tokens, compact=compact,
                                    every=sampling.COMPACT_EVERY, ended=call < max_new_tokens)
        steps += st
        row_steps += rs if compact else len(call) * st
    return _counts(steps, slots, row_steps, int((lengths - 1).sum()))


def refill(lengths: np.ndarray, slots: int) -> dict:
    """Every slot busy within the step (rows queued in order)."""
    _, end = _refill(lengths - 1, slots)
    tokens = int((lengths - 1).sum())
    return _counts(int(end.max(initial=0)), slots, tokens, tokens)


def partial(lengths: np.ndarray, slots: int, *, group_size: int, round_tokens: int,
            in_flight: int, prompt_len: int = 0, steps: int = PARTIAL_STEPS) -> dict:
    """Partial rollouts as built (trainer/partial.py), with refill: `in_flight` groups of
    `group_size` rows (the step's groups of `lengths`, over again); each round every
    unfinished row decodes up to `round_tokens` tokens (its first from the round's prefill of
    prompt + prefix, as any prompt's), a refill call on `slots` slots for the fresh prompts'
    rows and one for the carried rows; the step
    ends after the first round with B = len(lengths) / group_size groups finished and learns
    the B oldest. Mean per step over steps 2..`steps`; also the tokens the rounds re-encode
    (`reencoded_tokens`: each carried row's prompt of `prompt_len` tokens and its prefix; a
    fresh prompt's first round encodes it once for its G rows, as without partial
    rollouts)."""
    g = group_size
    groups = lengths.reshape(-1, g)
    b = len(groups)
    rest = np.zeros((0, g), int)  # tokens each row in flight has left, oldest group first
    sofar = np.zeros((0, g), int)  # and has decoded: the prefix a round re-encodes
    drawn, per_step = 0, []
    for _ in range(steps):
        new = in_flight - len(rest)
        rest = np.concatenate([rest, groups[(drawn + np.arange(new)) % b]])
        sofar = np.concatenate([sofar, np.zeros((new, g), int)])
        drawn += new
        stop = busy = reencoded = 0
        while (rest == 0).all(axis=1).sum() < b:
            live = rest > 0
            carried = live & (sofar > 0)
            take = np.minimum(rest, round_tokens)  # 0 on finished rows
            for rows in (live & ~carried, carried):  # a call of fresh rows, one of carried
                stop += int(_refill(take[rows] - 1, slots)[1].max(initial=0))
                busy += int((take[rows] - 1).sum())
            reencoded += int(sofar[carried].sum()) + prompt_len * int(carried.sum())
            rest, sofar = rest - take, sofar + take
        finished = np.flatnonzero((rest == 0).all(axis=1))[:b]
        rest, sofar = np.delete(rest, finished, axis=0), np.delete(sofar, finished, axis=0)
        per_step.append((stop, busy, reencoded))
    stops, busy, reencoded = np.array(per_step[1:], float).T
    return {**_counts(float(stops.mean()), slots, float(busy.mean()), float(busy.mean())),
            "reencoded_tokens": float(reencoded.mean())}


def _counts(steps: float, slots: int, row_steps: float, tokens: float) -> dict:
    """Decode steps, slot-steps (steps x slots), row-steps run (compute spent), tokens
    decoded, and the wasted slot-steps: those that decode no token."""
    slot_steps = steps * slots
    return {"decode_steps": steps, "slot_steps": slot_steps, "row_steps": row_steps,
            "tokens": tokens, "wasted_slot_steps": slot_steps - tokens}


def schedules(lengths: Any, slots: int, max_new_tokens: int, *, compact: bool,
              group_size: int, round_tokens: int, in_flight: int, prompt_len: int = 0) -> dict:
    """{today, refill, partial} counts (module docstring) for one step's `lengths` [B*G] in
    groups of `group_size`; partial rollouts' rounds of `round_tokens` tokens with
    `in_flight` prompts (rollout.partial_tokens and partial_prompts resolved), prompts of
    `prompt_len` tokens."""
    lengths = np.asarray(lengths, int)
    return {"today": today(lengths, slots, max_new_tokens, compact),
            "refill": refill(lengths, slots),
            "partial": partial(lengths, slots, group_size=group_size, round_tokens=round_tokens,
                               in_flight=in_flight, prompt_len=prompt_len)}


def describe(source: str) -> str:
    """The words for a `--lengths` source in the plan's output."""
    if source == "paper":
        return (f"paper-like mix ({PAPER_ACCURACY:.0%} right, median {PAPER_RIGHT[0]:.0%} of "
                f"the limit; of the wrong, {PAPER_WRONG_TRUNCATED:.0%} at the limit, the others "
                f"median {PAPER_WRONG[0]:.0%})")
    return f"as logged in {source.split(':', 1)[1]} (response_len_mean, frac_truncated)"


def load(source: str, cfg: Any) -> np.ndarray:
    """One step's [B*G] response lengths from a `--lengths` source: "paper" or
    "metrics:PATH". Raises ValueError (one line) for a source it cannot read."""
    r = cfg.rollout
    rows, n = r.prompts_per_step * r.group_size, r.max_new_tokens
    if source == "paper":
        return paper_mix(rows, n)
    if source.startswith("metrics:"):
        path = source.split(":", 1)[1]
        try:
            return from_metrics(path, rows, n)
        except OSError as e:
            raise ValueError(f"--lengths={source}: {e.strerror or e}") from None
    raise ValueError(f"--lengths={source}: expected paper, max or metrics:PATH")


def step_times(source: str, lengths: np.ndarray, cfg: Any, decode_step_s: float,
               decode_runs: float, step_s: float, *, prefill_token_s: float = 0.0) -> dict:
    """The plan's step time under one step's `lengths` (from `source`): for each schedule its
    counts, decode time (decode steps x `decode_step_s`) and step time (the worst-case
    `step_s` with its `decode_runs` decode steps replaced by these; partial rollouts' also
    with their re-encoded prefixes at `prefill_token_s` a token, the prefill's rate)."""
    from ibpo_jax.sampler import sampling

    r = cfg.rollout
    n = r.max_new_tokens
    slots = (r.sample_chunk or r.prompts_per_step) * r.group_size
    out = schedules(lengths, slots, n, compact=n >= sampling.COMPACT_MIN_NEW_TOKENS,
                    group_size=r.group_size, round_tokens=r.round_tokens,
                    in_flight=r.prompts_in_flight, prompt_len=r.max_prompt_len)
    for counts in out.values():
        counts["decode_s"] = counts["decode_steps"] * decode_step_s
        counts["reencode_s"] = counts.get("reencoded_tokens", 0.0) * prefill_token_s
        counts["step_s"] = (step_s - decode_runs * decode_step_s + counts["decode_s"]
                            + counts["reencode_s"])
    return {"source": describe(source), "slots": slots, "mean_length": float(lengths.mean()),
            "at_limit": float(np.mean(lengths >= n)), "worst_case_decode_steps": decode_runs,
            "schedules": out}
