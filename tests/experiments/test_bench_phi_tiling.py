"""experiments/benchmarks/bench_phi_tiling.py on CPU-sized shapes: one line per (tiling,
shape), every tiling giving the CPU tiling's φ, ratios taken at the shared shape only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "benchmarks"))
import bench_phi_tiling  # noqa: E402  (a script beside its siblings, not a package)


def test_every_tiling_gives_the_same_phi(capsys):
    assert bench_phi_tiling.main(["--tilings", "cpu,acc_ks32", "--groups", "2",
                                  "--base-groups", "1", "--lo", "40", "--hi", "70",
                                  "--repeats", "1"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    default = "cpu" if jax.default_backend() == "cpu" else "acc"
    assert lines[0]["name"] == "setup" and lines[0]["backend_default_tiling"] == default
    rows = [(d["tiling"], d["groups"]) for d in lines[1:]]
    assert rows == [("cpu", 1), ("acc_ks32", 1), ("acc_ks32", 2)]
    for d in lines[1:]:
        assert d["same_answers"] is True and d["gcells_per_s"] > 0 and d["cells"] > 0
    assert lines[2]["speedup_vs_cpu_tiling"] == pytest.approx(
        lines[1]["seconds"] / lines[2]["seconds"])
    assert lines[3]["speedup_vs_cpu_tiling"] is None


def test_unknown_tiling_names_the_valid_ones(capsys):
    with pytest.raises(SystemExit):
        bench_phi_tiling.main(["--tilings", "cpu,gpu"])
    assert "acc_chunk256" in capsys.readouterr().err
