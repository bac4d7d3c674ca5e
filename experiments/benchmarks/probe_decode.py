"""Where the sampler's decode time goes: per-step time of `sampling.generate_fn` at a few row
counts and depths of the tiny benchmark model (no peer; a breakdown for RESULTS.md).

    python -m experiments.benchmarks.probe_decode [--new-tokens 64] [--trials 5]

Prints one line per (rows, layers): total time of 32-token prompts -> new tokens (best of the
trials, compile excluded), time per decode step and generated tokens/s. If the time per step grows
with the rows, the cost is per-row work (attention over the cache, elementwise ops), not a fixed
loop overhead.

    python -m experiments.benchmarks.probe_decode --compaction configs/ibpo_gspo.py[:preset]

instead measures finished-row compaction on a run's first rollouts (its base policy, its
rollout shapes): the decode row-steps with and without it (`kv_cache.row_steps` on the sampled
lengths), the rollout time of both (alternating, best of the trials) and whether they sample
the same tokens; then the same count, analytically, for the paper's setting (8,192 new tokens,
256 rows per device) under two log-normal response-length distributions.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import host
from ibpo_jax import models
from ibpo_jax.runtime import hostmem
from ibpo_jax.sampler import sampling


def decode_time(rows: int, layers: int, new_tokens: int, trials: int) -> float:
    cfg = models.Qwen3Config(vocab_size=64, hidden_size=256, intermediate_size=768,
                             num_hidden_layers=layers, num_attention_heads=8,
                             num_key_value_heads=4, head_dim=32, tie_word_embeddings=True)
    params = models.init(cfg, jax.random.key(0)).params
    fn = sampling.generate_fn(cfg, models.make_options(jnp.float32), max_new_tokens=new_tokens,
                              temperature=1.0, eos_ids=(), num_samples=1)
    prompts = np.random.default_rng(0).integers(3, 64, (rows, 32)).astype(np.int32)
    lens = np.full(rows, 32, np.int32)
    jax.block_until_ready(fn(params, prompts, lens, jax.random.key(0)).tokens)  # compile
    best = float("inf")
    for i in range(trials):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(params, prompts, lens, jax.random.key(i + 1)).tokens)
        best = min(best, time.perf_counter() - t0)
    return best


def compaction(spec: str, steps: int, trials: int) -> None:
    """Row-steps and rollout time with and without compaction on `spec`'s first rollouts."""
    from ibpo_jax import config
    from ibpo_jax.models import kv_cache
    from ibpo_jax.trainer import loop
    from ibpo_jax.trainer.batching import encode_prompts

    cfg = config.load(spec)
    trainer = loop.Trainer(cfg, "/tmp/probe_decode_workdir", log=lambda *_: None)
    t = trainer.parts
    r = cfg.rollout
    fns = {c: sampling.generate_fn(
        t.base.config, t.base.options, max_new_tokens=r.max_new_tokens,
        temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, num_samples=r.group_size,
        eos_ids=tuple(t.tokenizer.eos_ids), pad_id=t.tokenizer.pad_id, mesh=t.mesh, compact=c)
        for c in (False, True)}
    saved, total, best, same = 0, 0, {False: float("inf"), True: float("inf")}, True
    for s in range(1, steps + 1):
        key = jax.random.fold_in(t.seed_key, s)
        records = [t.train_records[int(i)] for i in t.order.next_indices(r.prompts_per_step)]
        prompts = encode_prompts(t.tokenizer, [t.task.prompt_text(x) for x in records],
                                 r.max_prompt_len)
        outs = {}
        for trial in range(trials + (s == 1)):  # the first step's first trial compiles
            for c in (False, True):
                t0 = time.perf_counter()
                with jax.set_mesh(t.mesh):
                    outs[c] = jax.block_until_ready(
                        fns[c](trainer.state.params, prompts.tokens, prompts.lengths, key))
                if trial or s > 1:
                    best[c] = min(best[c], time.perf_counter() - t0)
        same &= bool((np.asarray(outs[False].tokens) == np.asarray(outs[True].tokens)).all())
        lengths = np.asarray(outs[False].lengths)
        plain, _ = kv_cache.row_steps(lengths, r.max_new_tokens, compact=False)
        packed, _ = kv_cache.row_steps(lengths, r.max_new_tokens, compact=True,
                                       every=sampling.COMPACT_EVERY)
        saved, total = saved + plain - packed, total + plain
        print(f"step {s}: {len(lengths)} rows, lengths mean {lengths.mean():.1f} max "
              f"{lengths.max()} of {r.max_new_tokens}; row-steps {plain} -> {packed} "
              f"({1 - packed / plain:.1%} saved)", flush=True)
    trainer.close()
    print(f"{spec}: row-steps saved {saved / total:.1%}; rollout best of {trials}: "
          f"{best[False]:.3f} s without, {best[True]:.3f} s with compaction; "
          f"same tokens: {same}", flush=True)
    rng = np.random.default_rng(0)
    for median, sigma in ((3000, 0.5), (4000, 0.55)):
        n = 8192
        lengths = np.minimum(rng.lognormal(np.log(median), sigma, (64, 256)).astype(int) + 1, n)
        plain = packed = 0
        for batch in lengths:  # 64 rollouts of 256 rows, ended unless cut at n
            plain += kv_cache.row_steps(batch, n, compact=False)[0]
            packed += kv_cache.row_steps(batch, n, compact=True, every=sampling.COMPACT_EVERY)[0]
        print(f"analytic, {n} new tokens, 256 rows, lengths log-normal(median {median}, sigma "
              f"{sigma}): mean {lengths.mean():.0f}, cut at {n}: {np.mean(lengths == n):.1%}; "
              f"row-steps saved {1 - packed / plain:.1%} (finished rows: "
              f"{1 - lengths.sum() / plain:.1%} of the uncompacted row-steps)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--compaction", metavar="CONFIG", default="")
    parser.add_argument("--steps", type=int, default=3, help="rollouts (--compaction)")
    args = parser.parse_args()
    hostmem.reuse_freed_memory()  # as the entry points do (ibpo_jax/runtime/hostmem.py)
    print(f"host: {host.cpu_model()}", flush=True)
    if args.compaction:
        compaction(args.compaction, args.steps, args.trials)
        return
    for rows, layers in [(64, 4), (8, 4), (64, 1), (8, 1)]:
        t = decode_time(rows, layers, args.new_tokens, args.trials)
        steps = args.new_tokens - 1  # the first token comes from the prefill
        print(f"rows {rows:3d} layers {layers}: {t * 1e3:7.1f} ms total, "
              f"{t / steps * 1e3:5.2f} ms / decode step, {rows * args.new_tokens / t:8.0f} tok/s",
              flush=True)


if __name__ == "__main__":
    main()
