"""Bit-parallel comparison kernels vs rapidfuzz (C++), in one process on the same pairs.

For each configuration (64 pairs of length 4000 and 16 pairs of length 16,000, ids drawn from a
Zipf law over the 151,936-token Qwen vocabulary; and 64 "late error" pairs of length 4000,
where b holds a's first 98 % in order among random units: a response that follows a correct one
for 98 % of its length, near the alignment rule's worst case, since it counts from column
a_len - 1 - f on) it times
  ours:      jax.jit(jax.vmap(f)), one call over all pairs, for f = comparison.lcs_first_error
             with alignment="lcs" (the default first error, DESIGN §2: LCS and the alignment's
             first unmatched unit), with alignment="prefix" (v1: LCS and the longest embedded
             prefix) and comparison.edit_distance; compile_s = first call (trace + compile +
             run), run_s = median of the later calls, each closed by block_until_ready;
  rapidfuzz: rapidfuzz.process.cpdist(a, b, scorer=LCSseq.similarity / Levenshtein.distance,
             workers=-1) on the same pairs (lists of ints), median of the same number of calls;
checks that both give identical LCS / distances (and that the alignment's first error never
exceeds the prefix rule's, as DESIGN §2 implies), and prints one JSON line per configuration with
cells/s (cells = sum of len(a) * len(b)), ratio = ours / rapidfuzz (> 1: we are faster) and
lcs_over_prefix = run time of the "lcs" rule / run time of the "prefix" rule (the extra work
of the alignment: one greedy-embedding scan, plus a masked popcount per word and text column
from column a_len - 1 - f on, f = the prefix rule's first error, printed as
prefix_rule_f_median). The
load average (`os.getloadavg`) is printed with each line: the machine may be shared.

    python -m experiments.benchmarks.bench_lcs [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import jax
import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import LCSseq, Levenshtein

from experiments import host
from ibpo_jax.core import comparison
from ibpo_jax.runtime import hostmem

VOCAB = 151_936
CONFIGS = ((64, 4000, "zipf"), (16, 16_000, "zipf"), (64, 4000, "late_error"))


def zipf_pairs(n_pairs: int, length: int, seed: int, kind: str = "zipf",
               ) -> tuple[np.ndarray, np.ndarray]:
    """Two [n_pairs, length] int32 arrays of ids with P(rank r) ∝ 1/r: independent draws
    ("zipf"), or b with a[:0.98 length] in order at random places among random draws
    ("late_error": the prefix rule's f is at least 0.98 length, so the alignment rule counts
    about 98 % of the columns)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, VOCAB + 1)
    p /= p.sum()
    draw = lambda: rng.choice(VOCAB, size=(n_pairs, length), p=p).astype(np.int32)  # noqa: E731
    a, b = draw(), draw()
    if kind == "late_error":  # b: a[:cut] in order at random places, the rest random draws
        cut = int(length * 0.98)
        for i in range(n_pairs):
            b[i, np.sort(rng.choice(length, cut, replace=False))] = a[i, :cut]
    return a, b


def _timed(fn, repeats: int) -> tuple[float, float, object]:
    """(first-call seconds, median of `repeats` later calls, last result)."""
    t = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return first, float(np.median(times)), out


def bench(n_pairs: int, length: int, kind: str, repeats: int) -> dict:
    a, b = zipf_pairs(n_pairs, length, seed=length, kind=kind)
    lens = np.full((n_pairs,), length, np.int32)
    cells = float(n_pairs) * length * length
    qa, qb = a.tolist(), b.tolist()
    dev = [jax.device_put(x) for x in (a, b, lens, lens)]
    result = {"pairs": n_pairs, "length": length, "kind": kind, "cells": cells}
    prefix = functools.partial(comparison.lcs_first_error, alignment="prefix")
    outs = {}
    for name, ours_fn, scorer in (
        ("lcs", comparison.lcs_first_error, LCSseq.similarity),
        ("lcs_prefix", prefix, LCSseq.similarity),
        ("levenshtein", comparison.edit_distance, Levenshtein.distance),
    ):
        jitted = jax.jit(jax.vmap(ours_fn))
        compile_s, run_s, out = _timed(lambda: jax.block_until_ready(jitted(*dev)), repeats)
        outs[name] = out
        ours = np.asarray(out if name == "levenshtein" else out[0])
        _, rf_s, ref = _timed(
            lambda: process.cpdist(qa, qb, scorer=scorer, workers=-1), repeats)  # noqa: B023
        if not np.array_equal(ours, np.asarray(ref)):
            raise AssertionError(f"{name}: kernel and rapidfuzz disagree")
        result[name] = {
            "ours_cells_per_s": cells / run_s,
            "rapidfuzz_cells_per_s": cells / rf_s,
            "ratio": rf_s / run_s,
            "ours_run_s": run_s,
            "ours_compile_s": compile_s,
            "rapidfuzz_s": rf_s,
        }
    if np.any(np.asarray(outs["lcs"][1]) > np.asarray(outs["lcs_prefix"][1])):
        raise AssertionError("alignment first error past the prefix rule's")
    result["lcs_over_prefix"] = result["lcs"]["ours_run_s"] / result["lcs_prefix"]["ours_run_s"]
    # how far the prefix rule's embedding reaches: the alignment rule counts from a_len - 1 - f
    result["prefix_rule_f_median"] = float(np.median(np.asarray(outs["lcs_prefix"][1])))
    result["load_avg"] = os.getloadavg()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smaller pairs (smoke test)")
    args = parser.parse_args()
    hostmem.reuse_freed_memory()  # as the entry points do (ibpo_jax/runtime/hostmem.py)
    configs = ((8, 1000, "zipf"), (4, 2000, "late_error")) if args.quick else CONFIGS
    env = {"jax": jax.__version__, "backend": jax.default_backend(),
           "cpu": host.cpu_model(), "cores": os.cpu_count(),
           "xla_flags": os.environ.get("XLA_FLAGS", "")}
    for n_pairs, length, kind in configs:
        print(json.dumps({"bench": "lcs", **bench(n_pairs, length, kind, args.repeats),
                          "env": env}),
              flush=True)


if __name__ == "__main__":
    main()
