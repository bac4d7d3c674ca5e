"""Run outputs: metrics.jsonl (one object per step), TensorBoard events, a progress bar.

On resume, rows of steps after the restored checkpoint (written by the killed run before it
died) are dropped from metrics.jsonl and purged from TensorBoard, so the file of a resumed run
equals that of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tqdm
from tensorboardX import SummaryWriter

_BAR_KEYS = (("reward_mean", "R"), ("accuracy", "acc"), ("phi_mean", "phi"),
             ("eval_accuracy", "eval"))


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.item() if np.ndim(value) == 0 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep the information
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class RunLog:
    """Writes metrics rows to jsonl + TensorBoard and drives the progress bar."""

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
        self._truncate_after(last_step)
        self._file = open(self.path, "a")
        self._tb = SummaryWriter(str(self.workdir / "tensorboard"), purge_step=last_step + 1)
        if progress:
            self._bar = tqdm.tqdm(total=total_steps, initial=max(last_step, 0), desc="rl",
                                  dynamic_ncols=True, file=sys.stderr)

    def _truncate_after(self, step: int) -> None:
        rows = [r for r in read_metrics(self.path) if r["step"] <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, self.path)  # atomic: a kill here leaves either file whole

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.is_main:
            return
        row = {"step": step, **{k: _jsonable(v) for k, v in sorted(metrics.items())}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self._tb.add_scalar(key, value, step)
        if self._bar is not None:
            shown = {short: f"{row[k]:.3f}" for k, short in _BAR_KEYS
                     if isinstance(row.get(k), (int, float))}
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(step - self._bar.n)

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
