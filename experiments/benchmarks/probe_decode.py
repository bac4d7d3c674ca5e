"""Where the sampler's decode time goes: per-step time of `sampling.generate_fn` at a few row
counts and depths of the tiny benchmark model (no peer; a breakdown for RESULTS.md).

    python experiments/benchmarks/probe_decode.py [--new-tokens 64] [--trials 5]

Prints one line per (rows, layers): total time of 32-token prompts -> new tokens (best of the
trials, compile excluded), time per decode step and generated tokens/s. If the time per step grows
with the rows, the cost is per-row work (attention over the cache, elementwise ops), not a fixed
loop overhead.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from ibpo_jax import host, hostmem, models, sampling


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    hostmem.reuse_freed_memory()  # as the entry points do (ibpo_jax/hostmem.py)
    print(f"host: {host.cpu_model()}", flush=True)
    for rows, layers in [(64, 4), (8, 4), (64, 1), (8, 1)]:
        t = decode_time(rows, layers, args.new_tokens, args.trials)
        steps = args.new_tokens - 1  # the first token comes from the prefill
        print(f"rows {rows:3d} layers {layers}: {t * 1e3:7.1f} ms total, "
              f"{t / steps * 1e3:5.2f} ms / decode step, {rows * args.new_tokens / t:8.0f} tok/s",
              flush=True)


if __name__ == "__main__":
    main()
