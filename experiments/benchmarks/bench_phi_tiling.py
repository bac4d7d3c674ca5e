"""φ under each kernel tiling, side by side in one process: DP cells/s and ratios.

`comparison.compute_phi` (lcs_first_error; `--alignment`, default "lcs" as the trainer's),
jitted and vmapped over groups of G responses of lo..hi units (shared group stems, as
`accelerator_check.py`'s phi section draws them), traced under each `_bitparallel.Tiling`
named in --tilings. Two shapes: `--groups` groups for every tiling except `cpu`, and
`--base-groups` groups for all of them, so each tiling's ratio to the CPU tiling is taken at
one shape. Every tiling must give the same φ and first errors (checked; the script fails
otherwise; `--save DIR` also writes each case's φ and first errors as .npz, to compare across
machines). One JSON line per figure on stdout; a case stops timing at its budget after the
first call and one timed call (`--repeats 0`: the first call only, to check answers).

    python -m experiments.benchmarks.bench_phi_tiling                      # accelerator shapes
    python -m experiments.benchmarks.bench_phi_tiling --groups 2 --base-groups 1 --lo 512 \\
        --hi 1024                                                           # a CPU-sized run
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from experiments.host import cpu_model
from ibpo_jax.core import _bitparallel, comparison

ACC = _bitparallel.ACCELERATOR_TILING
TILINGS = {  # the candidates measured for ACCELERATOR_TILING (RESULTS.md)
    "cpu": _bitparallel.CPU_TILING,
    "acc_ks32": dataclasses.replace(ACC, max_ks=32, table_words=1 << 27),
    "acc_ks64": dataclasses.replace(ACC, max_ks=64, table_words=1 << 27),
    "acc": ACC,
    "acc_chunk256": dataclasses.replace(ACC, max_ks=64, table_words=1 << 27, chunk_pairs=256),
}


def group_units(rng: np.random.Generator, groups: int, g: int, lo: int, hi: int, vocab: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """units [B, G, hi] int32: each row a shared group stem, then its own tokens from a
    random cut on; lengths [B, G] in [lo, hi]; correct [B, G], about half."""
    stem = rng.integers(0, vocab, (groups, 1, hi))
    own = rng.integers(0, vocab, (groups, g, hi))
    cut = rng.integers(0, hi, (groups, g, 1))
    units = np.where(np.arange(hi) < cut, stem, own).astype(np.int32)
    lengths = rng.integers(lo, hi + 1, (groups, g)).astype(np.int32)
    return units, lengths, rng.random((groups, g)) < 0.5


def measure(tiling: _bitparallel.Tiling, args: tuple, budget_s: float, repeats: int,
            alignment: str = "lcs") -> tuple[float, float | None, comparison.Phi]:
    """(first call s, best later call s or None when repeats = 0, output) of compute_phi
    traced under `tiling`."""
    with _bitparallel.use_tiling(tiling):
        fn = jax.jit(jax.vmap(functools.partial(comparison.compute_phi,
                                                operator="lcs_first_error",
                                                alignment=alignment)))
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
    first, best = time.perf_counter() - t0, math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - t0 > budget_s:
            break
    return first, (None if repeats == 0 else best), out


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tilings", default=",".join(TILINGS))
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--base-groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lo", type=int, default=4096)
    p.add_argument("--hi", type=int, default=8192)
    p.add_argument("--alignment", default="lcs", choices=comparison.ALIGNMENTS)
    p.add_argument("--save", type=Path, help="write <tiling>_<groups>.npz (phi, first_error)")
    p.add_argument("--budget", type=float, default=30.0, help="seconds per case")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed calls after the first; 0: the first call only (answers check)")
    a = p.parse_args(argv)
    names = a.tilings.split(",")
    if bad := [n for n in names if n not in TILINGS]:
        p.error(f"--tilings: unknown {bad}; valid: {list(TILINGS)}")
    dev = jax.devices()[0]
    emit(name="setup", device_kind=dev.device_kind, platform=dev.platform, host_cpu=cpu_model(),
         jax=jax.__version__, backend_default_tiling="cpu" if jax.default_backend() == "cpu"
         else "acc", tilings={n: dataclasses.asdict(TILINGS[n]) for n in names})
    units, lengths, correct = group_units(np.random.default_rng(5),
                                          max(a.groups, a.base_groups), a.group_size, a.lo,
                                          a.hi, 151_936)
    seconds: dict[tuple[str, int], float] = {}
    for groups in dict.fromkeys([a.base_groups, a.groups]):  # the base shape first
        args = [jax.device_put(x[:groups]) for x in (units, lengths, correct)]
        cells = float(np.sum(np.sum(lengths[:groups].astype(np.float64), axis=1) ** 2))
        ref, ref_name = None, ""
        for name in names:
            if name == "cpu" and groups != a.base_groups:
                continue  # the CPU tiling is the slow peer: timed at the base shape only
            first, best, out = measure(TILINGS[name], args, a.budget, a.repeats, a.alignment)
            got = (np.asarray(out.phi), np.asarray(out.first_error))
            if a.save:
                a.save.mkdir(parents=True, exist_ok=True)
                np.savez(a.save / f"{name}_{groups}.npz", phi=got[0], first_error=got[1])
            same = ref is None or all(np.array_equal(x, y) for x, y in zip(got, ref))
            if ref is None:
                ref, ref_name = got, name
            seconds[name, groups] = best
            base = seconds.get(("cpu", groups))
            emit(name="phi_cells_per_s", tiling=name, groups=groups, group_size=a.group_size,
                 units=[a.lo, a.hi], alignment=a.alignment, cells=cells, seconds=best,
                 first_call_s=first,
                 gcells_per_s=None if best is None else cells / best / 1e9, same_answers=same,
                 speedup_vs_cpu_tiling=None if base is None or best is None else base / best)
            if not same:
                print(f"tiling {name}: φ or first errors differ from {ref_name}'s at "
                      f"{groups} groups", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
