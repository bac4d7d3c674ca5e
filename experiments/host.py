"""What this host is: the CPU that every benchmark figure and every run record names.

Minutes per run and benchmark ratios depend on the CPU (XLA:CPU vs MKL ratios swing up to 2x
between hosts), and "AMD EPYC" alone named both a Zen 3 host (family 25 model 1, AVX2: 100
GFLOP/s on a 2048³ matmul with 2 vCPUs) and one that ran it at 484
(experiments/benchmarks/RESULTS.md), hence family / model and the widest vector unit.
"""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model(cpuinfo: str | None = None) -> str:
    """'<model name> [family F model M, <widest of avx512f/avx2/avx>]' from /proc/cpuinfo
    (or the `cpuinfo` text given), else what `platform` knows (macOS, no procfs)."""
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        text = ""
    info: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():  # the first processor's block is enough
            break
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    if "model name" not in info:
        return platform.processor() or platform.machine() or "unknown"
    flags = info.get("flags", "").split()
    simd = next((f for f in ("avx512f", "avx2", "avx") if f in flags), "")
    return (f"{info['model name']} [family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')}{', ' + simd if simd else ''}]")


# Outputs and prose, not code: a probe that writes its first seed's record and report (the
# README's verdict table too) must not call the code that measures the next seed "dirty".
NOT_CODE = ("experiments/results", "README.md", "docs")


def git_commit(root: str | Path | None = None) -> tuple[str, bool]:
    """(commit hash, dirty) of the checkout holding `root` (default: this package), so a
    record names the code that made it; ("unknown", False) outside a git checkout. Dirty:
    a tracked file outside `NOT_CODE` differs from the commit."""
    import subprocess

    cwd = Path(root) if root is not None else Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                 ":/", *(f":(top,exclude){p}" for p in NOT_CODE)],
                                cwd=cwd, capture_output=True, text=True, check=True,
                                timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    return head, bool(status.strip())
