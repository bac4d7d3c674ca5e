"""hostmem.reuse_freed_memory: the CPU backend dispatches single-device computations on the
calling thread, whose large freed blocks glibc then keeps for reuse instead of unmapping them
(what XLA:CPU's per-execution temporary buffer needs)."""

import ast
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

SCRIPT = """
import ctypes, resource, sys
import jax
from ibpo_jax.runtime import hostmem
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
    code = ("import jax; jax.numpy.zeros(1).block_until_ready()\n"
            "from ibpo_jax.runtime import hostmem\n"
            "try:\n    hostmem.reuse_freed_memory()\nexcept RuntimeError as e:\n"
            "    print('refused:', e)")
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                         capture_output=True, text=True).stdout
    assert "refused: hostmem.reuse_freed_memory() must run before" in out


@pytest.mark.parametrize("platforms, plugins, expected", [
    ("cpu", ["xla_cuda12"], True),  # JAX_PLATFORMS decides, whatever is installed
    ("cuda", [], False),
    ("cuda,cpu", [], False),  # the CPU only as a fallback: an accelerator run
    ("tpu", [], False),
    ("", [], True),  # unset: jax can only pick the CPU
    ("", ["xla_cuda12"], False),  # unset with jax[cuda12] installed: jax picks the GPU
    ("", ["libtpu"], False),
])
def test_cpu_backend_is_decided_from_the_environment(platforms, plugins, expected, monkeypatch):
    from ibpo_jax.runtime import hostmem

    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    monkeypatch.delenv("JAX_PLATFORM_NAME", raising=False)
    monkeypatch.setattr(hostmem, "accelerator_plugins", lambda: plugins)
    assert hostmem.cpu_backend_expected() is expected


GPU_SCRIPT = """
import sys
from ibpo_jax.runtime import hostmem
print(hostmem.accelerator_plugins())
print(hostmem.reuse_freed_memory())
print(sorted(m for m in sys.modules if m == "jax" or m.startswith("jax.")))
"""


def test_an_installed_accelerator_plugin_leaves_memory_and_jax_alone(tmp_path):
    """jax[cuda12] installs a module under the jax_plugins namespace package: with
    JAX_PLATFORMS unset, jax would start the GPU, so nothing is changed and jax is not even
    imported (no backend started early, none of jax's private modules)."""
    plugin = tmp_path / "jax_plugins" / "xla_fake_gpu"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_PLATFORM_NAME")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    out = subprocess.run([sys.executable, "-c", GPU_SCRIPT], check=True, timeout=120, env=env,
                         capture_output=True, text=True, cwd=ROOT).stdout.splitlines()
    assert out == ["['xla_fake_gpu']", "False", "[]"]


def _private_jax_imports(tree: ast.AST, where: str | None = None):
    """(enclosing function or None, module) of each import of jax._src in `tree`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _private_jax_imports(node, node.name)
            continue
        names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        yield from ((where, n) for n in names if n == "jax._src" or n.startswith("jax._src."))
        yield from _private_jax_imports(node, where)


def test_no_module_imports_jax_private_modules_outside_the_cpu_check():
    """jax._src is read in one place, hostmem._backend_started, which only the CPU path
    calls; every other module sticks to jax's public API."""
    found = {(path.relative_to(ROOT).as_posix(), where, module)
             for path in sorted((ROOT / "ibpo_jax").rglob("*.py"))
             for where, module in _private_jax_imports(ast.parse(path.read_text()))}
    assert found == {("ibpo_jax/runtime/hostmem.py", "_backend_started", "jax._src")}


def test_a_trim_gives_freed_heap_memory_back_to_the_system():
    """What a checkpoint on the CPU backend does after orbax's host copy (hostmem docstring):
    heap memory freed under reuse_freed_memory's settings stays resident (that is their
    point) until trimmed, then leaves the process's resident set."""
    import subprocess
    import sys

    script = '''
import ctypes
from ibpo_jax.runtime import hostmem
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
libc.mallopt(-4, 0); libc.mallopt(-1, 2**31 - 1)  # reuse_freed_memory's malloc settings

def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])

def churn():  # 256 MiB in 1 MiB blocks, written, then freed
    blocks = [libc.malloc(1 << 20) for _ in range(256)]
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    for b in blocks:
        libc.free(b)

churn()
held = rss()
assert hostmem.return_freed_memory()
print(held - rss())
'''
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)
    assert int(out.stdout) > 200 * 1024  # KiB: most of the 256 MiB given back
