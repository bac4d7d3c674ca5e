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

Call it before the first jax computation (the entry points and benchmarks do): the CPU client
reads the dispatch mode when it starts, and the mallopt settings are process-wide, so they
must be in place before XLA's threads allocate. The malloc part is a no-op where the C library
is not glibc (macOS, musl).

CPU runs only: on a GPU or TPU the process's host memory holds pinned staging buffers and the
runtime's own heaps, which a never-unmapping, never-trimmed main arena would only bloat. Which
backend jax will pick is decided from the environment (`cpu_backend_expected`) without
starting one (jax.distributed.initialize, which the entry points call next, must come before
any backend, and a GPU client preallocates the device's memory when it starts) and without
jax's private modules.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import pkgutil
import platform

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt(3) parameters (glibc malloc.h)
_INT_MAX = 2**31 - 1
# Platforms that name the CPU in JAX_PLATFORMS (jax's aliases included).
_CPU_NAMES = ("cpu", "host")


def accelerator_plugins() -> list[str]:
    """The accelerator backends installed for jax (none: it can only run on the CPU): PJRT
    plugins in the `jax_plugins` namespace package or entry-point group (jax[cuda12] installs
    one), and libtpu (jax[tpu])."""
    found = []
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        found += [m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)]
    found += [ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")]
    if importlib.util.find_spec("libtpu") is not None:
        found.append("libtpu")
    return sorted(set(found))


def cpu_backend_expected() -> bool:
    """Whether jax will run on its CPU backend: JAX_PLATFORMS lists only the CPU, or (unset)
    no accelerator plugin is installed. When in doubt, not (the settings stay off)."""
    platforms = os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_PLATFORM_NAME") or ""
    names = [p.strip().lower() for p in platforms.split(",") if p.strip()]
    if names:
        return all(n in _CPU_NAMES for n in names)
    return not accelerator_plugins()


def _backend_started() -> bool:
    """Whether a jax backend is already running (then the dispatch mode is fixed). Read
    through jax's private module, on the CPU path only; False if it has moved."""
    try:
        from jax._src import xla_bridge  # no public equivalent that would not start one

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return False


def reuse_freed_memory() -> bool:
    """On the CPU backend: synchronous single-device dispatch, and glibc's main arena kept, not
    unmapped; True when both took effect. Elsewhere (a GPU or TPU run) nothing, False."""
    if not cpu_backend_expected():
        return False
    if _backend_started():
        raise RuntimeError("hostmem.reuse_freed_memory() must run before the first jax "
                           "computation (the CPU client reads the dispatch mode at start)")
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)
    libc = _glibc()
    return libc is not None and all(
        libc.mallopt(param, value) == 1
        for param, value in ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _INT_MAX)))


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc on Linux (whose malloc these settings are for), else
    None (macOS, musl)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def return_freed_memory() -> bool:
    """Gives the C library's free heap memory back to the system (glibc's malloc_trim over
    every arena); True where it ran. For after a checkpoint on the CPU backend: orbax copies
    the train state to host buffers, and under `reuse_freed_memory`'s settings what is freed
    stays with the process; without a trim the resident set grew by about half the state at
    every checkpoint (experiments/benchmarks/host_memory.py, RESULTS.md)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True

