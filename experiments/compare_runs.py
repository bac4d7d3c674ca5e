"""Base vs final held-out accuracy of finished runs, grouped by algorithm, mean ± std over seeds.

    python experiments/compare_runs.py WORKDIR [WORKDIR ...]

Each WORKDIR is a `--workdir` of `python -m ibpo_jax.train` (its config.json says the algorithm
and seed; metrics.jsonl holds the eval rows and the per-step metrics). Prints a markdown table:
eval accuracy (avg@k) at step 0 and at the last step, the gain, the per-step means of φ over
wrong responses, of Var(A) under IBPO and under GSPO for the same batches (unnormalized eqs.
11 / 10) and of the first-error agreement with the arith checker, and wall time per RL step.
Works on a run of any task: a metric a run did not log (first-error agreement without a
checker that reports a first wrong step, φ under the terminal operator) shows as —.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def run_summary(workdir: Path) -> tuple[str, int, dict[str, float]]:
    cfg = json.loads((workdir / "config.json").read_text())
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    evals = [r for r in rows if "eval_accuracy" in r]
    steps = [r for r in rows if r["step"] > 0]
    if len(evals) < 2 or not steps:
        raise SystemExit(f"{workdir}: unfinished run (needs eval rows at the start and the end)")
    step_s = [sum(v for k, v in r.items() if k.startswith("time_") and k != "time_total_s"
                  and isinstance(v, (int, float))) for r in steps]
    comparing = cfg["ibpo"]["operator"] != "terminal"  # else φ = 0 and no first error

    def mean(key: str) -> float:
        """Over the steps that logged `key` (a number); NaN (shown —) when none did."""
        vals = [r[key] for r in steps if isinstance(r.get(key), (int, float))]
        return statistics.mean(vals) if vals else math.nan

    return cfg["algo"], cfg["seed"], {
        "base": evals[0]["eval_accuracy"],
        "final": evals[-1]["eval_accuracy"],
        "gain": evals[-1]["eval_accuracy"] - evals[0]["eval_accuracy"],
        "phi": mean("phi_mean"),
        "var_ibpo": mean("adv_var"),
        "var_gspo": mean("adv_var_gspo"),
        "first_error": mean("first_error_agreement") if comparing else float("nan"),
        "step_s": statistics.median(step_s),
    }


def _fmt(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    values = [v for v in values if not math.isnan(v)]  # a seed that did not log it
    if not values:  # not logged, or not defined for this algorithm
        return "—"
    m = statistics.mean(values) * scale
    if len(values) < 2:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {statistics.stdev(values) * scale:.{digits}f}"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    by_algo: dict[str, list[tuple[int, dict[str, float]]]] = defaultdict(list)
    for arg in argv:
        algo, seed, summary = run_summary(Path(arg))
        by_algo[algo].append((seed, summary))
    print("| algorithm | seeds | eval acc. base (%) | final (%) | gain (pts) | per seed gain "
          "| mean φ | Var(A) IBPO / GSPO | first-error agreement | s / RL step |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for algo, runs in sorted(by_algo.items()):
        runs.sort()
        col = lambda key: [s[key] for _, s in runs]  # noqa: E731
        per_seed = ", ".join(f"{s['gain'] * 100:+.1f}" for _, s in runs)
        print(f"| {algo} | {', '.join(str(seed) for seed, _ in runs)} "
              f"| {_fmt(col('base'), 100)} | {_fmt(col('final'), 100)} "
              f"| {_fmt(col('gain'), 100)} | {per_seed} | {_fmt(col('phi'), digits=3)} "
              f"| {_fmt(col('var_ibpo'), digits=3)} / {_fmt(col('var_gspo'), digits=3)} "
              f"| {_fmt(col('first_error'), digits=2)} | {_fmt(col('step_s'), digits=2)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
