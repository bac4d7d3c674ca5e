"""Host memory on the CPU backend: reuse XLA's per-execution temporary buffer instead of
faulting it in again every step.

XLA:CPU allocates each execution's temporary buffer (254 MB for the benchmark's tiny Qwen3
training step) with posix_memalign and frees it after. Run on one of its dispatch threads,
glibc serves a block that large with a fresh mmap and unmaps it at free, so every step
page-faults the whole buffer in again, 4 KiB at a time: ~62,000 faults, ~15 % of a CPU
training step here. `reuse_freed_memory()` runs single-device computations on the calling
thread (jax_cpu_enable_async_dispatch off; the trainer waits for each result anyway) and lets
that thread's arena, the main one, grow instead of mmapping and keep what is freed: the same
memory then serves every step (~60 faults). Measured in experiments/benchmarks/RESULTS.md;
the price is that the process keeps its peak heap. Computations over several devices still
dispatch asynchronously (and still fault).

Call it before the first jax computation (the entry points and benchmarks do). The malloc
part is a no-op where the C library is not glibc (macOS, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import jax
from jax._src import xla_bridge

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt(3) parameters (glibc malloc.h)
_INT_MAX = 2**31 - 1


def reuse_freed_memory() -> bool:
    """Synchronous single-device CPU dispatch, and glibc's main arena kept, not unmapped;
    True when both took effect."""
    if xla_bridge.backends_are_initialized():
        raise RuntimeError("hostmem.reuse_freed_memory() must run before the first jax "
                           "computation (the CPU client reads the dispatch mode at start)")
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    return all(libc.mallopt(param, value) == 1
               for param, value in ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _INT_MAX)))
