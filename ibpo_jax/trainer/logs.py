"""Run outputs: metrics.jsonl (one object per step), per-step record files such as
appendix_a.jsonl, TensorBoard events, a progress bar.

On resume, rows of steps after the restored checkpoint (written by the killed run before it
died) are dropped from metrics.jsonl and the record files and purged from TensorBoard, so the
files of a resumed run equal those of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import tqdm
from tensorboardX import SummaryWriter

from ibpo_jax.trainer.workdir import RunError

_BAR_KEYS = (("reward_mean", "R"), ("accuracy", "acc"), ("phi_mean", "phi"),
             ("eval_accuracy", "eval"))


class MetricsFileError(RunError):
    """metrics.jsonl is damaged before its last line."""


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.item() if np.ndim(value) == 0 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep the information
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl. A last line that does not parse is the torn write of a
    run that died mid-line: dropped with a warning (resume then rewrites the file without
    it); a bad line before the last is damage and raises MetricsFileError naming FILE:LINE."""
    path = Path(path)
    if not path.exists():
        return []
    lines = [(i, line) for i, line in enumerate(
        path.read_bytes().decode("utf-8", "replace").splitlines(), start=1) if line.strip()]
    rows = []
    for k, (line_no, line) in enumerate(lines):
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("not a metrics row")
        except ValueError as e:
            if k < len(lines) - 1:
                raise MetricsFileError(f"{path}:{line_no}: unreadable metrics row ({e})") \
                    from None
            warnings.warn(f"{path}:{line_no}: dropped a torn last line (the run died while "
                          f"writing it): {line[:60]!r}", RuntimeWarning, stacklevel=2)
            break
        rows.append(row)
    return rows


# Per-step record files beside metrics.jsonl (each line an object with its "step").
RECORDS = ("appendix_a.jsonl",)


def _line(row: dict[str, Any], name: str) -> str:
    """One jsonl line; record files (lists of per-row values) are written without spaces."""
    return json.dumps(row, separators=(",", ":") if name in RECORDS else None) + "\n"


def _truncate_after(path: Path, step: int) -> None:
    """Drops the rows of steps after `step` from the jsonl at `path` (if there is one)."""
    if not path.exists():
        return
    rows = [r for r in read_metrics(path) if r["step"] <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(_line(r, path.name) for r in rows))
    os.replace(tmp, path)  # atomic: a kill here leaves either file whole


class RunLog:
    """Writes metrics rows to jsonl + TensorBoard, per-step records to their own jsonl, and
    drives the progress bar."""

    def __init__(self, workdir: str | Path, *, total_steps: int, last_step: int,
                 progress: bool, is_main: bool = True):
        """`last_step`: the step restored from a checkpoint, or -1 for a fresh run."""
        self.workdir = Path(workdir)
        self.is_main = is_main
        self.path = self.workdir / "metrics.jsonl"
        self._tb = None
        self._bar = None
        if not is_main:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        for path in (self.path, *(self.workdir / name for name in RECORDS)):
            _truncate_after(path, last_step)
        self._file = open(self.path, "a")
        self._tb = SummaryWriter(str(self.workdir / "tensorboard"), purge_step=last_step + 1)
        if progress:
            self._bar = tqdm.tqdm(total=total_steps, initial=max(last_step, 0), desc="rl",
                                  dynamic_ncols=True, file=sys.stderr)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.is_main:
            return
        row = {"step": step, **{k: _jsonable(v) for k, v in sorted(metrics.items())}}
        self._file.write(_line(row, self.path.name))
        self._file.flush()
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self._tb.add_scalar(key, value, step)
        if self._bar is not None:
            shown = {short: f"{row[k]:.3f}" for k, short in _BAR_KEYS
                     if isinstance(row.get(k), (int, float))}
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(step - self._bar.n)

    def record(self, name: str, row: dict[str, Any]) -> None:
        """Appends `row` (with its "step") to the record file `name`, one of RECORDS."""
        if name not in RECORDS:
            raise ValueError(f"record file {name!r}: not one of {', '.join(RECORDS)}")
        if self.is_main:
            with open(self.workdir / name, "a") as f:
                f.write(_line(row, name))

    def info(self, message: str) -> None:
        if not self.is_main:
            return
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
            self._file.close()


def summary_table(first: dict, last: dict, rows: list[dict]) -> str:
    """summary.md of a run: its first and last evaluation rows and the means of its RL steps'
    `rows`, as a markdown table."""

    def mean(key: str) -> float:
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        return float(np.mean(vals)) if vals else float("nan")

    lines = [
        "| metric | value |", "|---|---|",
        f"| eval accuracy, base (step {first['step']}) | {first.get('eval_accuracy', 'n/a')} |",
        f"| eval accuracy, final (step {last['step']}) | {last.get('eval_accuracy', 'n/a')} |",
        f"| train accuracy, mean over steps | {mean('accuracy'):.4f} |",
        f"| mean φ (wrong responses) | {mean('phi_mean'):.4f} |",
        f"| mean Cov(Y, φ) | {mean('cov_y_phi'):.4f} |",
        f"| mean Var(A) IBPO / GSPO (eqs. 10-11) | {mean('adv_var'):.4f} / "
        f"{mean('adv_var_gspo'):.4f} |",
        f"| throughput, sampled tokens/s | {mean('tokens_per_s'):.1f} |",
        f"| trajectories sampled | {last.get('budget_trajectories', 0)} |",
    ]
    return "\n".join(lines)
