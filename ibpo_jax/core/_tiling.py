"""How the bit-parallel kernels (`ibpo_jax.core._bitparallel`) cut a batch into sequential work:
a `Tiling` per backend, or the one `use_tiling` sets. It changes the work, never the answers."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import jax


@dataclasses.dataclass(frozen=True)
class Tiling:
    """How a batch is cut into sequential work. Static: read when a kernel is traced."""

    target_width: int  # pairs x words per scan step at most
    table_words: int  # P * 31 ks^2: the words of one stripe's match table at most
    max_ks: int  # words per stripe at most
    chunk_pairs: int  # larger batches run as a sequence of chunks of this many pairs


# 2-core CPUs: ~512 lanes per step is the measured sweet spot, a 0.5 MB table stays in L2, and
# chunks of 32 pairs measured ~10% faster than 16 or 64 for both kernels on 64 x 4000 (the
# per-stripe set-up is O(P La)).
CPU_TILING = Tiling(target_width=512, table_words=1 << 17, max_ks=32, chunk_pairs=32)
# GPUs and TPUs: every loop step costs about one launch whatever its width, so steps are as wide
# as memory allows: all pairs of a call in one chunk (up to 1,024) and stripes of up to 128 words
# within a 1 GB table. On an H200, 16 groups x G 8 x 4k-8k units: 57 Gcells/s, against 36 with
# 64-word stripes, 21 with 32, 10 in chunks of 256 pairs, 0.29 with CPU_TILING
# (experiments/benchmarks/RESULTS.md).
ACCELERATOR_TILING = Tiling(target_width=1 << 30, table_words=1 << 28, max_ks=128,
                            chunk_pairs=1024)
_override: list[Tiling] = []


def current_tiling() -> Tiling:
    """The tiling of kernels called without one: `use_tiling`'s, else the default backend's."""
    if _override:
        return _override[-1]
    return CPU_TILING if jax.default_backend() == "cpu" else ACCELERATOR_TILING


@contextlib.contextmanager
def use_tiling(t: Tiling) -> Iterator[None]:
    """Kernels traced inside the block without a tiling of their own use `t` (benchmarks and
    tests; results never depend on it). A function jitted before keeps the tiling it was
    traced with."""
    _override.append(t)
    try:
        yield
    finally:
        _override.pop()
