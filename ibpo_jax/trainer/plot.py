"""Training curves of one or more runs, from their metrics.jsonl, to a PNG.

    python -m ibpo_jax.trainer.plot RUN [RUN ...] [--out FILE] [--metrics KEY,KEY,...]

RUN is a run's workdir (or its metrics.jsonl). One panel per metric that some run logged (by
default reward, accuracy, φ, KL, entropy, response length and eval accuracy), one line per run,
against the RL step. FILE defaults to RUN/curves.png for one run, curves.png for several.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from ibpo_jax.trainer.logs import read_metrics

# (metrics.jsonl key, panel title) drawn by default, in this order, when a run logged them.
DEFAULT_METRICS = (
    ("reward_mean", "reward (mean)"), ("accuracy", "train accuracy"),
    ("phi_mean", "φ (mean, wrong responses)"), ("kl", "KL to the reference"),
    ("entropy", "policy entropy"), ("response_len_mean", "response length (tokens)"),
    ("eval_accuracy", "eval accuracy (avg@k)"),
)


def metrics_file(run: str | Path) -> Path:
    """The metrics.jsonl of `run` (a workdir or the file itself); exits naming a missing one."""
    path = Path(run)
    path = path if path.suffix == ".jsonl" else path / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (is {run} a run's --workdir?)")
    return path


def curves(rows: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that logged `key` as a finite number."""
    pts = [(r["step"], float(r[key])) for r in rows
           if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
           and math.isfinite(r[key])]
    return [s for s, _ in pts], [v for _, v in pts]


def plot(runs: dict[str, list[dict]], out: Path,
         metrics: Sequence[tuple[str, str]] = DEFAULT_METRICS) -> list[str]:
    """Draws one panel per metric of `metrics` that a run in `runs` (label -> metrics rows)
    logged; writes the PNG `out`; returns the keys drawn."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    shown = [(k, title) for k, title in metrics if any(curves(r, k)[0] for r in runs.values())]
    if not shown:
        raise SystemExit(f"none of {', '.join(k for k, _ in metrics)} is in the runs' "
                         "metrics.jsonl")
    cols = min(3, len(shown))
    nrows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, shown):
        for label, rows in runs.items():
            steps, values = curves(rows, key)
            if steps:  # eval rows are sparse: mark the points
                ax.plot(steps, values, marker="o" if len(steps) < 12 else None, label=label)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(shown):]:
        ax.set_visible(False)
    if len(runs) > 1:
        axes.flat[0].legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return [k for k, _ in shown]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ibpo_jax.trainer.plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run workdirs (or metrics.jsonl)")
    parser.add_argument("--out", help="the PNG to write")
    parser.add_argument("--metrics", help="comma-separated metrics.jsonl keys to draw instead")
    args = parser.parse_args(argv)
    files = [metrics_file(run) for run in args.runs]
    labels = [f.parent.name for f in files]
    if len(set(labels)) < len(labels):  # same-named workdirs: use the paths
        labels = [str(f.parent) for f in files]
    runs = {label: read_metrics(f) for label, f in zip(labels, files)}
    out = Path(args.out) if args.out else (
        files[0].parent / "curves.png" if len(files) == 1 else Path("curves.png"))
    chosen = DEFAULT_METRICS if not args.metrics else tuple(
        (k.strip(), k.strip()) for k in args.metrics.split(",") if k.strip())
    drawn = plot(runs, out, chosen)
    print(f"{out}: {', '.join(drawn)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
