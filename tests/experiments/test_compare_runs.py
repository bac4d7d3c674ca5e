"""experiments/compare_runs.py on runs of any task: a metric a run did not log shows as —."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(workdir: Path, algo: str, seed: int, operator: str, extra: dict) -> Path:
    """A finished run's config.json and metrics.jsonl (eval rows at 0 and 2)."""
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps(
        {"algo": algo, "seed": seed, "ibpo": {"operator": operator}}))
    rows = [{"step": 0, "eval_accuracy": 0.2},
            {"step": 1, "adv_var": 0.5, "adv_var_gspo": 0.7, "time_rollout_s": 1.0, **extra},
            {"step": 2, "adv_var": 0.3, "adv_var_gspo": 0.5, "time_rollout_s": 3.0,
             "time_update_s": "nan", **extra, "eval_accuracy": 0.5}]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return workdir


def _table(*workdirs: Path) -> dict[str, list[str]]:
    out = subprocess.run([sys.executable, "experiments/compare_runs.py", *map(str, workdirs)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and
            not line.startswith("| algorithm")]
    return {c[0]: c for c in ([x.strip() for x in r.strip("|").split("|")] for r in rows)}


def test_a_countdown_run_without_first_error_agreement(tmp_path):
    """Countdown's checker reports no first wrong step: no first_error_agreement rows (the
    script raised StatisticsError on such runs); the other columns are computed."""
    table = _table(_run(tmp_path / "cd", "ibpo_gspo", 0, "prefix", {"phi_mean": 2.0}))
    cells = table["ibpo_gspo"]
    assert cells[2:5] == ["20.0", "50.0", "30.0"]  # base, final, gain
    assert cells[6] == "2.000" and cells[7] == "0.400 / 0.600"
    assert cells[8] == "—"  # first-error agreement: not logged
    assert cells[9] == "2.00"  # median s / step; the "nan" time string is skipped


def test_missing_in_one_seed_uses_the_others_and_terminal_shows_dash(tmp_path):
    a = _run(tmp_path / "a", "ibpo_gspo", 0, "prefix", {"first_error_agreement": 0.8})
    b = _run(tmp_path / "b", "ibpo_gspo", 1, "prefix", {})
    g = _run(tmp_path / "g", "gspo", 0, "terminal", {"first_error_agreement": 0.9})
    table = _table(a, b, g)
    assert table["ibpo_gspo"][1] == "0, 1" and table["ibpo_gspo"][8] == "0.80"
    assert table["gspo"][6] == "—" and table["gspo"][8] == "—"  # no φ, no first error
