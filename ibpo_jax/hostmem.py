"""Host memory: let glibc keep freed memory for reuse instead of handing it back to the OS.

XLA:CPU allocates each execution's temporary buffer (about 250 MB for a training step of the
benchmark's tiny Qwen3) with posix_memalign on a worker thread. glibc serves a request that
large in a thread arena with a fresh mmap and unmaps it on free, so every step page-faults the
whole buffer in again, 4 KiB at a time: ~60,000 faults per step, ~15 % of a CPU training
step here. One arena, no mmap for large blocks and no trimming make glibc reuse the same
memory from step to step (0-100 faults per step). The cost: the process keeps its peak heap.

Call `reuse_freed_memory()` first thing in a process that runs jax on the CPU, before jax
starts its threads (the entry points and the benchmarks do). A no-op where the C library is
not glibc (macOS, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# mallopt(3) parameters (glibc malloc.h).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX, _M_ARENA_TEST, _M_ARENA_MAX = -1, -2, -4, -7, -8
_INT_MAX = 2**31 - 1


def reuse_freed_memory() -> bool:
    """Sets glibc's malloc to one arena, no mmap'd blocks, no trimming; True if it did."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    settings = ((_M_ARENA_TEST, 1), (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0),
                (_M_TRIM_THRESHOLD, _INT_MAX), (_M_TOP_PAD, 64 << 20))
    return all(libc.mallopt(param, value) == 1 for param, value in settings)
