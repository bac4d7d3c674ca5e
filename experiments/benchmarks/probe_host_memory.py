"""Page faults of XLA:CPU's per-execution temporary buffer, and what changes them (a
breakdown for RESULTS.md).

    python -m experiments.benchmarks.probe_host_memory             # jax and glibc defaults
    python -m experiments.benchmarks.probe_host_memory --hostmem   # runtime.hostmem (used by
                                                                   # the entry points)
    python -m experiments.benchmarks.probe_host_memory --mallopt   # one arena, no mmap, no trim
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python -m experiments.benchmarks.probe_host_memory

Prints the forward + backward time of the tiny benchmark Qwen3 (16 x 128 tokens, as
bench_model.py's train step) and the minor page faults per step (getrusage). `--hostmem` and
`--mallopt` must act before jax starts, so they run first thing.
"""

from __future__ import annotations

import argparse
import ctypes
import resource
import time


def glibc_keep_freed_memory() -> None:
    libc = ctypes.CDLL("libc.so.6")
    # M_ARENA_TEST, M_ARENA_MAX, M_MMAP_MAX, M_TRIM_THRESHOLD, M_TOP_PAD (glibc malloc.h)
    for param, value in ((-7, 1), (-8, 1), (-4, 0), (-1, 2**31 - 1), (-2, 64 << 20)):
        assert libc.mallopt(param, value) == 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hostmem", action="store_true")
    parser.add_argument("--mallopt", action="store_true")
    args = parser.parse_args()
    if args.mallopt:
        glibc_keep_freed_memory()
    if args.hostmem:
        from ibpo_jax.runtime import hostmem

        hostmem.reuse_freed_memory()
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ibpo_jax import models

    cfg = models.Qwen3Config(vocab_size=64, hidden_size=256, intermediate_size=768,
                             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                             head_dim=32)
    m = models.init(cfg, jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (16, 128)), jnp.int32)

    def loss(params):
        return -jnp.sum(models.token_logprobs(cfg, m.options, params, tokens).logprobs)

    grad = jax.jit(jax.grad(loss))
    for _ in range(3):
        jax.block_until_ready(grad(m.params))
    steps = 10
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(grad(m.params))
    dt = (time.perf_counter() - t0) / steps
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps
    from experiments import host

    print(f"forward + backward {dt * 1e3:.1f} ms, {faults:.0f} minor page faults per step "
          f"({host.cpu_model()})")


if __name__ == "__main__":
    main()
