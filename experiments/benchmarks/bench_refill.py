"""Slot refill against today's sampler (issue 59, item 3): decode steps, slot-steps, wasted
slot-steps and wall time of one step's rollout, side by side, with ratios.

    python -m experiments.benchmarks.bench_refill [--trials 3] [--workload skewed|arith_long|all]

Samplers, on the same rows (B prompts x G samples) and `slots` = sample_chunk x G rows decoding
at once:

- ``today``: the rollout in calls of sample_chunk prompts (`Placement` with rollout.sample_chunk),
  each call decoding until its longest row ends; compaction, which drops finished rows between
  legs (fewer rows read, not fewer steps), is counted from the same lengths
  (`kv_cache.row_steps`) and timed where it is on by default (>= 512 new tokens);
- ``refill``: one call over the step's queue of rows, `slots` rows busy, `block` finished slots
  refilled at a time (`sampler/refill.py`; rollout.refill);
- the plan's model of refill (`plan.lengths.refill`: a slot takes the next row the step its row
  ends), what its step-time row assumes, on the same lengths. Partial rollouts are not built
  (issue 59 item 2).

A slot-step is one slot for one decode step; a wasted one decodes no token of any row (a
finished row's slot while its call runs on, an empty slot). Every row's first token comes from
its prefill, so a row of length L needs L - 1 decode slot-steps.

Workloads:

- ``skewed``: a random Qwen3 (2 layers, d 128) whose EOS set is 4 of its 256 tokens, so each
  token ends a row with probability ~1/64: lengths are geometric, cut at the 256-token limit,
  which a third of the rows reach. That is the shape the paper's step has (a wrong answer often
  runs to the limit, a right one stops early, `plan.lengths.paper_mix`); a geometric tail is
  the memoryless case, the least favourable to refill short of equal lengths. Its lengths'
  quantiles are printed.
- ``arith_long``: the task's warm-started base policy on the first step's 32 prompts x G 8
  (96 new tokens at most), the trainer's own sampler settings.

Wall times are XLA:CPU's on this host (the CPU model is printed): the slot-step counts are what
carries to an accelerator, where decode time is close to proportional to decode steps.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from experiments import host
from ibpo_jax import models
from ibpo_jax.plan import lengths as plan_lengths
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import refill, sampling


def _best(fn, trials: int) -> tuple[float, object]:
    out = fn()  # compiles
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def compare(name: str, gen_one, refills: dict, params, prompts: np.ndarray, lens: np.ndarray,
            chunk: int, g: int, n: int, key, trials: int) -> dict:
    """`gen_one` (one-pass sampler, called per chunk of prompts) against the refill samplers
    `refills` ({label: sampler})."""
    def today():
        outs = [gen_one(params, prompts[i:i + chunk], lens[i:i + chunk],
                        jax.random.fold_in(key, i)) for i in range(0, len(lens), chunk)]
        return jax.block_until_ready(outs)

    t_today, outs = _best(today, trials)
    refilled = {}
    for label, fn in refills.items():
        t, out = _best(lambda fn=fn: jax.block_until_ready(fn(params, prompts, lens, key)),
                       trials)
        refilled[label] = (t, fn.last_stats, sharding.host_array(out.lengths))
    lengths = next(iter(refilled.values()))[2]
    today_lengths = np.concatenate([sharding.host_array(o.lengths) for o in outs])
    useful = int(lengths.sum()) - len(lengths)
    slots = chunk * g
    # Today's counts from its own samples (a chunked call draws other uniforms than one call),
    # by the plan's model of its calls (exact for them: each runs to its longest row).
    plain = plan_lengths.today(today_lengths, slots, n, compact=False)
    packed = plan_lengths.today(today_lengths, slots, n, compact=True)
    model = plan_lengths.refill(lengths, slots)
    row = {
        "workload": name, "rows": len(lengths), "slots": slots, "max_new_tokens": n,
        "length_quantiles": {q: float(np.quantile(lengths, q / 100)) for q in (10, 50, 90)},
        "at_limit": float(np.mean(lengths == n)),
        "today": {"decode_steps": plain["decode_steps"], "slot_steps": plain["slot_steps"],
                  "wasted": plain["wasted_slot_steps"], "wall_s": t_today,
                  "compaction_row_steps": packed["row_steps"]},
        "refill": {label: {"decode_steps": st.decode_steps, "slot_steps": st.slot_steps,
                           "wasted": st.wasted_slot_steps, "wall_s": t}
                   for label, (t, st, _) in refilled.items()},
        "plan_refill": {"decode_steps": model["decode_steps"],
                        "wasted": model["wasted_slot_steps"]},
    }
    for _, st, got in refilled.values():  # one call's samples, whatever the block
        np.testing.assert_array_equal(got, lengths)
        assert st.slot_steps - st.wasted_slot_steps == useful
    return row


def skewed(trials: int) -> dict:
    cfg = models.Qwen3Config(vocab_size=256, hidden_size=128, intermediate_size=256,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=32, initializer_range=0.05)
    m = models.init(cfg, jax.random.key(0))
    b, g, n, chunk, p = 16, 8, 256, 4, 16
    rng = np.random.default_rng(0)
    prompts = rng.integers(4, 256, (b, p)).astype(np.int32)
    lens = rng.integers(4, p + 1, b).astype(np.int32)
    kw = dict(max_new_tokens=n, eos_ids=(0,), num_samples=g, pad_id=1)
    one = sampling.generate_fn(cfg, m.options, compact=False, **kw)
    return compare("skewed", one, _refills(cfg, m.options, chunk * g, kw), m.params, prompts,
                   lens, chunk, g, n, jax.random.key(1), trials)


def _refills(config, options, slots: int, kw: dict) -> dict:
    """Refill with its default block and with a block of one slot (the least waste)."""
    default = refill.refill_fn(config, options, slots=slots, **kw)
    return {f"block {default.block}": default,
            "block 1": refill.refill_fn(config, options, slots=slots, block=1, **kw)}


def arith_long(trials: int) -> dict:
    from ibpo_jax import config
    from ibpo_jax.trainer import loop
    from ibpo_jax.trainer.batching import encode_prompts

    cfg = config.load("configs/gspo.py:arith_long")
    trainer = loop.Trainer(cfg, "/tmp/bench_refill_workdir", log=lambda *_: None)
    try:
        run, r = trainer.parts, cfg.rollout
        chunk = r.prompts_per_step // 4
        records = [run.train_records[int(i)] for i in run.order.next_indices(r.prompts_per_step)]
        prompts = encode_prompts(run.tokenizer, [run.task.prompt_text(x) for x in records],
                                 r.max_prompt_len)
        kw = dict(**cfg.sampling(), num_samples=r.group_size,
                  eos_ids=tuple(run.tokenizer.eos_ids), pad_id=run.tokenizer.pad_id)
        one = sampling.generate_fn(run.base.config, run.base.options, **kw)
        refills = _refills(run.base.config, run.base.options, chunk * r.group_size, kw)
        return compare("arith_long", one, refills, trainer.policy, prompts.tokens,
                       prompts.lengths, chunk, r.group_size, r.max_new_tokens,
                       jax.random.key(1), trials)
    finally:
        trainer.close()


def report(row: dict) -> str:
    t, q = row["today"], row["length_quantiles"]
    lines = [
        f"{row['workload']}: {row['rows']} rows, {row['slots']} slots, lengths p10/p50/p90 "
        f"{q[10]:.0f}/{q[50]:.0f}/{q[90]:.0f} of {row['max_new_tokens']} "
        f"({row['at_limit']:.0%} at the limit)",
        f"  today : {t['decode_steps']:6d} decode steps, {t['slot_steps']:7d} slot-steps, "
        f"{t['wasted']:7d} wasted ({t['wasted'] / t['slot_steps']:.0%}), {t['wall_s']:.2f} s "
        f"(compaction would run {t['compaction_row_steps']} row-steps)",
    ]
    for label, f in row["refill"].items():
        lines += [
            f"  refill, {label}: {f['decode_steps']:6d} decode steps, {f['slot_steps']:7d} "
            f"slot-steps, {f['wasted']:7d} wasted ({f['wasted'] / f['slot_steps']:.0%}), "
            f"{f['wall_s']:.2f} s",
            f"    today / refill: decode steps {t['decode_steps'] / f['decode_steps']:.2f}x, "
            f"wasted slot-steps {t['wasted'] / max(f['wasted'], 1):.2f}x, wall "
            f"{t['wall_s'] / f['wall_s']:.2f}x"]
    p = row["plan_refill"]
    lines.append(f"  the plan's refill (a slot refilled the step its row ends): "
                 f"{p['decode_steps']} decode steps, {p['wasted']} wasted")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--workload", choices=("skewed", "arith_long", "all"), default="all")
    args = parser.parse_args(argv)
    print(f"host: {host.cpu_model()}, jax {jax.__version__}, {jax.default_backend()}",
          flush=True)
    for name, fn in (("skewed", skewed), ("arith_long", arith_long)):
        if args.workload in (name, "all"):
            print(report(fn(args.trials)), flush=True)


if __name__ == "__main__":
    main()
