"""python -m ibpo_jax.trainer.plot: one panel per logged metric, from metrics.jsonl, to a PNG."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ibpo_jax.trainer import plot

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def _run(workdir: Path, steps: int, *, phi: bool) -> Path:
    """A run's metrics.jsonl: eval rows at 0 and the end, RL rows between (φ if `phi`)."""
    workdir.mkdir(parents=True)
    rows = [{"step": 0, "eval_accuracy": 0.1}]
    for s in range(1, steps + 1):
        row = {"step": s, "reward_mean": s / steps, "accuracy": s / (2 * steps), "kl": 0.01 * s,
               "entropy": "nan"}  # a non-finite value as logs._jsonable writes it
        row.update({"phi_mean": 2.0} if phi else {})
        rows.append(row)
    rows[-1]["eval_accuracy"] = 0.4
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return workdir


def test_one_run_draws_the_metrics_it_logged_beside_it(tmp_path, capsys):
    run = _run(tmp_path / "gspo", 5, phi=False)
    assert plot.main([str(run)]) == 0
    png = run / "curves.png"
    assert png.read_bytes().startswith(PNG) and png.stat().st_size > 10_000
    drawn = capsys.readouterr().out.split(": ")[1].strip().split(", ")
    # Only what was logged as a number: no φ in this run, entropy was never finite.
    assert drawn == ["reward_mean", "accuracy", "kl", "eval_accuracy"]


def test_several_runs_share_panels_and_missing_metrics_stay_out(tmp_path):
    a, b = _run(tmp_path / "a", 4, phi=True), _run(tmp_path / "b", 6, phi=False)
    out = tmp_path / "figs" / "both.png"
    runs = {w.name: plot.read_metrics(w / "metrics.jsonl") for w in (a, b)}
    assert "phi_mean" in plot.plot(runs, out)  # one run having it is enough
    assert out.read_bytes().startswith(PNG)
    assert plot.curves(runs["a"], "eval_accuracy") == ([0, 4], [0.1, 0.4])
    assert plot.curves(runs["b"], "entropy") == ([], [])


def test_cli_chosen_metrics_and_errors(tmp_path):
    run = _run(tmp_path / "r", 3, phi=True)
    out = tmp_path / "kl.png"
    proc = subprocess.run([sys.executable, "-m", "ibpo_jax.trainer.plot", str(run),
                           "--out", str(out),
                           "--metrics", "kl,phi_mean"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{out}: kl, phi_mean" and out.read_bytes().startswith(PNG)
    with pytest.raises(SystemExit, match="no such file"):
        plot.main([str(tmp_path / "nowhere")])
    with pytest.raises(SystemExit, match="none of nope"):
        plot.main([str(run), "--metrics", "nope"])
