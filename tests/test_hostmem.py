"""hostmem.reuse_freed_memory: large blocks freed by a worker thread are reused, not faulted in
again (what XLA:CPU's per-execution temporary buffer needs)."""

import platform
import subprocess
import sys

import pytest

SCRIPT = """
import ctypes, resource, sys, threading
from ibpo_jax import hostmem
if sys.argv[1] == "on":
    assert hostmem.reuse_freed_memory()
libc = ctypes.CDLL("libc.so.6")

def work():  # as XLA:CPU's worker threads do: posix_memalign, write, free a 64 MB block
    for _ in range(10):
        p = ctypes.c_void_p()
        assert libc.posix_memalign(ctypes.byref(p), 64, 64 << 20) == 0
        ctypes.memset(p, 1, 64 << 20)
        libc.free(p)

t = threading.Thread(target=work); t.start(); t.join()  # warm-up: the first block is new
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t = threading.Thread(target=work); t.start(); t.join()
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
    assert on <= 17_000  # reused: at most one block's pages (seen now and then) faulted again
