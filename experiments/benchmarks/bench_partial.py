"""Partial rollouts against today's sampler and refill (issue 59, item 3): per step, in steady
state, decode steps, slot-steps, wasted slot-steps and wall time, side by side with ratios.

    python -m experiments.benchmarks.bench_partial [--steps 9] [--workload skewed|arith_long|all]
        [--model small|0.6b] [--json PATH]

A step here is the rollout of one RL step: B prompts x G finished responses handed to the update.
The weights stay fixed (what is measured is the decode schedule, not learning), and each
sampler runs `--steps` steps over the same prompt stream; the first step is left out (a cold
start, and the compiles). Samplers, with `slots` = sample_chunk x G rows decoding at once:

- ``today``: each step samples its B prompts in calls of sample_chunk prompts, each call
  decoding until its longest row ends;
- ``refill``: one call over the step's queue of B x G rows, `slots` rows busy
  (`rollout.refill`);
- ``partial`` (`rollout.partial`, trainer/partial.py): 2B prompts in flight, decoded in rounds
  of max_new_tokens / 4 tokens a row, in calls of `slots` rows; the step ends after the first
  round with B whole groups finished, the rest carried over;
- ``refill + partial``: the same, each round a refill call over the fresh prompts' rows and one
  over the carried rows.

Counts: a slot-step is one slot for one decode step; a wasted one decodes no token of a row the
step keeps (a finished row's slot while its call runs on, an empty slot, a filler row). Today's
and refill's counts as in `bench_refill`; partial's from its own rounds. The partial samplers
also decode tokens of rows later steps learn, so their tokens per step differ from B x G rows'
(printed). Workloads: `bench_refill`'s (the skewed geometric lengths, `arith_long`'s base
policy). `--model 0.6b` runs the skewed workload on a random model of Qwen3-0.6B's dimensions in
bf16 (its EOS set a 64th of the vocabulary, so lengths are geometric as with the small model's):
on an accelerator, where a decode step of a 0.6B model is bound by reading its weights, the
wall times say what the saved decode steps buy (`accelerator_check.sh schedules`). The host's
CPU model and the device are printed, and written with every figure by `--json`.
"""

from __future__ import annotations

import argparse
import json
import time
import types
from pathlib import Path

import jax
import numpy as np

from experiments import host
from ibpo_jax import models
from ibpo_jax.config.sections import RolloutConfig
from ibpo_jax.plan import lengths as plan_lengths
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import refill, sampling
from ibpo_jax.trainer import partial


class _Ids:
    """A prompt is its space-separated token ids (the skewed workload's random prompts)."""

    bos_id = None

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def encode(self, text: str) -> list[int]:
        return [int(x) for x in text.split()]


def _flight(cfg, mesh, first, sampler, eos, pad_id) -> partial.InFlight:
    return partial.InFlight(cfg, mesh=mesh, first=first, sampler=sampler, pad_id=pad_id,
                            is_eos=lambda t: np.isin(t, eos))


def run_partial(flight: partial.InFlight, collector, params, key, steps: int) -> dict:
    """Mean per step over steps 2..`steps` of the flight's counts and wall time."""
    rows = []
    for s in range(steps):
        t0 = time.perf_counter()
        _, _, out = flight.sample(collector, jax.random.fold_in(key, s), params)
        jax.block_until_ready(out)
        m = flight.metrics
        rows.append((m["decode_steps"], m["slot_steps"], m["wasted_slot_steps"],
                     m["slot_steps"] - m["wasted_slot_steps"], m["policy_lag"],
                     time.perf_counter() - t0))
    return _steady(rows)


def _steady(rows: list[tuple]) -> dict:
    """The mean per step of (decode steps, slot-steps, wasted, tokens, lag, wall) rows over
    steps 2.. (step 1: a cold start and the compiles)."""
    mean = np.mean(rows[1:], axis=0)
    return dict(zip(("decode_steps", "slot_steps", "wasted", "tokens", "policy_lag", "wall_s"),
                    map(float, mean)))


def run_plain(fn, params, draw, key, steps: int, chunk: int, slots: int, n: int) -> dict:
    """Today's sampler (`fn` one-pass, in calls of `chunk` prompts) or, `chunk` None, the
    refill sampler over the step's queue: mean per step over steps 2..`steps`."""
    rows = []
    for s in range(steps):
        prompts, lens = draw()
        k = jax.random.fold_in(key, s)
        t0 = time.perf_counter()
        cast = fn.shared(params)  # one compute-dtype copy a step, as the trainer makes
        if chunk is None:
            out = jax.block_until_ready(fn(params, prompts, lens, k, cast=cast))
            st = fn.last_stats
            counts = (st.decode_steps, st.slot_steps, st.wasted_slot_steps)
            lengths = sharding.host_array(out.lengths)
        else:
            outs = jax.block_until_ready([fn(params, prompts[i:i + chunk], lens[i:i + chunk],
                                             jax.random.fold_in(k, i), cast=cast)
                                          for i in range(0, len(lens), chunk)])
            lengths = np.concatenate([sharding.host_array(o.lengths) for o in outs])
            c = plan_lengths.today(lengths, slots, n, compact=False)
            counts = (c["decode_steps"], c["slot_steps"], c["wasted_slot_steps"])
        wall = time.perf_counter() - t0
        rows.append((*counts, int(lengths.sum()) - len(lengths), 0.0, wall))
    return _steady(rows)


def _rollout(b, g, n, p, chunk, refill_on):
    """A run config's stand-in holding the rollout section partial rollouts read (defaults:
    rounds of n / 4 tokens, 2b prompts in flight)."""
    r = RolloutConfig(prompts_per_step=b, group_size=g, max_new_tokens=n, max_prompt_len=p,
                      sample_chunk=chunk, refill=refill_on, partial=True)
    return types.SimpleNamespace(rollout=r)


def _skewed_model(kind: str) -> tuple[models.Qwen3LM, tuple[int, ...], int, tuple[int, int]]:
    """(model, EOS ids, pad id, the prompts' token range) of the skewed workload: each token
    ends a row with probability about 1/64 (EOS a 64th of a near-uniform distribution)."""
    if kind == "0.6b":
        from ibpo_jax.models.config import QWEN3_PRESETS

        cfg = QWEN3_PRESETS["qwen3-0.6b"]
        m = models.init(cfg, jax.random.key(0), dtype=jax.numpy.bfloat16,
                        param_dtype=jax.numpy.float32, scan_layers=True)
        eos = tuple(range(cfg.vocab_size // 64))
        return m, eos, cfg.vocab_size - 1, (len(eos), cfg.vocab_size - 1)
    cfg = models.Qwen3Config(vocab_size=256, hidden_size=128, intermediate_size=256,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=32, initializer_range=0.05)
    return models.init(cfg, jax.random.key(0)), (0,), 1, (4, 256)


def skewed(steps: int, kind: str = "small") -> dict:
    m, eos, pad, (low, high) = _skewed_model(kind)
    cfg = m.config
    b, g, n, chunk, p = 16, 8, 256, 4, 16
    rng = np.random.default_rng(0)
    records = [{"q": " ".join(map(str, rng.integers(low, high, rng.integers(4, p + 1))))}
               for _ in range(b * (steps + 4) * 2)]
    mesh = sharding.make_mesh(data=1, devices=jax.devices()[:1])
    kw = dict(eos_ids=eos, pad_id=pad, mesh=mesh)
    slots = chunk * g

    def collector():
        from ibpo_jax.data.sampler import IndexSampler
        return types.SimpleNamespace(
            records=records, order=IndexSampler(len(records), seed=0, shuffle=False),
            tokenizer=_Ids(pad), task=types.SimpleNamespace(prompt_text=lambda r: r["q"]),
            mesh=mesh)

    def draw_fn():
        c = collector()

        def draw():
            from ibpo_jax.trainer.batching import encode_prompts
            idx = c.order.next_indices(b)
            enc = encode_prompts(c.tokenizer, [records[int(i)]["q"] for i in idx], p)
            return enc.tokens, enc.lengths
        return draw

    key = jax.random.key(1)
    one = sampling.generate_fn(cfg, m.options, max_new_tokens=n, num_samples=g,
                               compact=False, **kw)
    ref = refill.refill_fn(cfg, m.options, slots=slots, max_new_tokens=n, num_samples=g, **kw)
    with jax.set_mesh(mesh):
        rows = {"today": run_plain(one, m.params, draw_fn(), key, steps, chunk, slots, n),
                "refill": run_plain(ref, m.params, draw_fn(), key, steps, None, slots, n)}
    for label, on in (("partial", False), ("refill + partial", True)):
        rollout = _rollout(b, g, n, p, chunk, on)
        make = refill.refill_fn if on else sampling.generate_fn
        extra = dict(slots=slots) if on else dict(compact=False)
        first, sampler = (make(cfg, m.options, max_new_tokens=n // 4, num_samples=s, **kw,
                               **extra) for s in (g, 1))
        flight = _flight(rollout, mesh, first, sampler, eos, pad)
        rows[label] = run_partial(flight, collector(), m.params, key, steps)
    return {"workload": f"skewed ({kind} model)", "rows": b * g, "slots": slots,
            "max_new_tokens": n, "steps": steps, **rows}


def arith_long(steps: int) -> dict:
    from ibpo_jax import config
    from ibpo_jax.trainer import loop
    from ibpo_jax.trainer.batching import encode_prompts

    rows, meta = {}, {}
    for label, over in (("today", []), ("refill", [("rollout.refill", "true")]),
                        ("partial", [("rollout.partial", "true")]),
                        ("refill + partial", [("rollout.partial", "true"),
                                              ("rollout.refill", "true")])):
        base = config.load("configs/gspo.py:arith_long")
        chunk = base.rollout.prompts_per_step // 4
        cfg = config.load("configs/gspo.py:arith_long",
                          [("rollout.sample_chunk", str(chunk)), *over])
        trainer = loop.Trainer(cfg, f"/tmp/bench_partial_{len(rows)}", log=lambda *_: None)
        try:
            run, r = trainer.parts, cfg.rollout
            g, n, slots = r.group_size, r.max_new_tokens, chunk * r.group_size
            meta = {"rows": r.prompts_per_step * g, "slots": slots, "max_new_tokens": n}
            key = jax.random.key(1)
            if r.partial:
                rows[label] = run_partial(run.collector.flight, run.collector, trainer.policy,
                                          key, steps)
                continue

            def draw(run=run, r=r):
                idx = run.order.next_indices(r.prompts_per_step)
                enc = encode_prompts(run.tokenizer, [run.task.prompt_text(run.train_records[
                    int(i)]) for i in idx], r.max_prompt_len)
                return enc.tokens, enc.lengths
            with jax.set_mesh(run.mesh):
                rows[label] = run_plain(run.generate, trainer.policy, draw, key, steps,
                                        None if r.refill else chunk, slots, n)
        finally:
            trainer.close()
    return {"workload": "arith_long", **meta, "steps": steps, **rows}


def report(row: dict) -> str:
    t = row["today"]
    lines = [f"{row['workload']}: {row['rows']} rows a step, {row['slots']} slots, "
             f"max_new_tokens {row['max_new_tokens']}; mean per step over steps 2-{row['steps']}"]
    for label in ("today", "refill", "partial", "refill + partial"):
        f = row[label]
        lines.append(
            f"  {label:16s}: {f['decode_steps']:7.0f} decode steps, {f['slot_steps']:8.0f} "
            f"slot-steps, {f['wasted']:7.0f} wasted "
            f"({f['wasted'] / max(f['slot_steps'], 1):.0%}), {f['tokens']:7.0f} tokens "
            f"decoded, policy lag {f['policy_lag']:.2f}, {f['wall_s']:.2f} s")
        if label != "today":
            lines.append(
                f"    today / {label}: decode steps "
                f"{t['decode_steps'] / max(f['decode_steps'], 1):.2f}x, wasted slot-steps "
                f"{t['wasted'] / max(f['wasted'], 1):.2f}x, wall "
                f"{t['wall_s'] / max(f['wall_s'], 1e-9):.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--workload", choices=("skewed", "arith_long", "all"), default="all")
    parser.add_argument("--model", choices=("small", "0.6b"), default="small",
                        help="the skewed workload's model")
    parser.add_argument("--json", default="", help="also write the figures here")
    args = parser.parse_args(argv)
    where = {"host": host.cpu_model(), "jax": jax.__version__,
             "backend": jax.default_backend(), "device": jax.devices()[0].device_kind}
    print(", ".join(f"{k}: {v}" for k, v in where.items()), flush=True)
    rows = []
    for name, fn in (("skewed", lambda s: skewed(s, args.model)), ("arith_long", arith_long)):
        if args.workload in (name, "all"):
            rows.append(fn(args.steps))
            print(report(rows[-1]), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps({**where, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
