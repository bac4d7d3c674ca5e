"""Every module of the package and the experiments stays readable: at most 500 lines, and no
function or method over 60 lines (from its `def` to its last line, decorators excluded)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("ibpo_jax", "experiments")  # experiments/ includes benchmarks/
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def sources() -> list[Path]:
    return sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py"))


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES, base: Path = REPO) -> list[str]:
    """`path:line name (n lines)` for every function or method longer than `limit`, nested
    ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f"{path.relative_to(base)}:{node.lineno} {node.name} ({n} lines)")
    return out


def long_modules(paths: list[Path], limit: int = MAX_MODULE_LINES, base: Path = REPO
                 ) -> list[str]:
    out = []
    for p in paths:
        n = len(p.read_text().splitlines())
        if n > limit:
            out.append(f"{p.relative_to(base)} ({n} lines)")
    return out


def test_the_checks_count_what_they_claim(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    src = tmp_path / "m.py"  # ok: def + 59 lines (its decorator not counted); too_long: 61
    src.write_text(f"@decorator\ndef ok():\n{body}\n\ndef too_long():\n{body}    return 1\n")
    assert long_functions(src, 60, base=tmp_path) == ["m.py:64 too_long (61 lines)"]
    assert long_modules([src], 123, base=tmp_path) == ["m.py (124 lines)"]
    assert long_modules([src], 124, base=tmp_path) == []


def test_no_module_over_500_lines():
    paths = sources()
    assert len(paths) > 50 and any("benchmarks" in p.parts for p in paths)
    offenders = long_modules(paths)
    assert not offenders, (f"modules over {MAX_MODULE_LINES} lines:\n  "
                           + "\n  ".join(offenders))


def test_no_function_over_60_lines():
    offenders = [f for p in sources() for f in long_functions(p)]
    assert not offenders, (f"functions over {MAX_FUNCTION_LINES} lines:\n  "
                           + "\n  ".join(offenders))
