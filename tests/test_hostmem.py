"""hostmem.reuse_freed_memory: the CPU backend dispatches single-device computations on the
calling thread, whose large freed blocks glibc then keeps for reuse instead of unmapping them
(what XLA:CPU's per-execution temporary buffer needs)."""

import platform
import subprocess
import sys

import pytest

SCRIPT = """
import ctypes, resource, sys
import jax
from ibpo_jax import hostmem
if sys.argv[1] == "on":
    assert hostmem.reuse_freed_memory()
    assert jax.config.read("jax_cpu_enable_async_dispatch") is False
libc = ctypes.CDLL("libc.so.6")

def work():  # as XLA:CPU does per execution: posix_memalign, write, free a 64 MB block
    for _ in range(10):
        p = ctypes.c_void_p()
        assert libc.posix_memalign(ctypes.byref(p), 64, 64 << 20) == 0
        ctypes.memset(p, 1, 64 << 20)
        libc.free(p)

work()  # warm-up: the first block is new memory
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
work()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    def faults(mode):
        out = subprocess.run([sys.executable, "-c", SCRIPT, mode], check=True, timeout=120,
                             capture_output=True, text=True)
        return int(out.stdout.split()[-1])

    off, on = faults("off"), faults("on")
    assert off > 10 * 16_000  # 10 blocks x 16k pages of 4 KiB each, faulted in every time
    assert on < 1_000


def test_refuses_once_the_backend_is_running():
    code = ("import jax; jax.numpy.zeros(1).block_until_ready(); from ibpo_jax import hostmem\n"
            "try:\n    hostmem.reuse_freed_memory()\nexcept RuntimeError as e:\n"
            "    print('refused:', e)")
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                         capture_output=True, text=True).stdout
    assert "refused: hostmem.reuse_freed_memory() must run before" in out
