"""Run outputs: metrics.jsonl (one object per step), per-step record files such as
appendix_a.jsonl and samples.jsonl, the scalars again on the other backends of
config.logging.backends (TensorBoard, W&B) under grouped tags (`tag`), a progress bar.

On resume, rows of steps after the restored checkpoint (written by the killed run before it
died) are dropped from metrics.jsonl and the record files and purged from TensorBoard, so the
files of a resumed run equal those of an uninterrupted one.
"""

from __future__ import annotations

import html
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
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


class LoggingBackendError(RunError):
    """A backend of config.logging.backends cannot start."""


# TensorBoard / W&B groups of the metrics.jsonl keys (which stay flat: the reproduction reads
# them): Appendix A's quantities, the credit φ assigns, evaluation, timing; the rest is train/.
_APPENDIX_A = ("cov_y_phi", "lambda_max", "adv_var", "pg_", "grad_share_before_error")
_CREDIT = ("phi_", "adv_", "first_error", "cancellation_", "shared_logprob_drift", "units_")


def tag(key: str) -> str:
    """The grouped tag of metrics key `key`, e.g. eval_accuracy -> eval/eval_accuracy."""
    if key.startswith("eval_"):
        group = "eval"
    elif key.startswith("time_") or key == "tokens_per_s":
        group = "time"
    elif key.startswith(_APPENDIX_A):
        group = "appendix_a"
    elif key.startswith(_CREDIT):
        group = "credit"
    else:
        group = "train"
    return f"{group}/{key}"


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
RECORDS = ("appendix_a.jsonl", "samples.jsonl")


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


class _TensorBoard:
    """DIR/tensorboard/ events; steps after `last_step` (a killed run's) are purged."""

    def __init__(self, workdir: Path, last_step: int, config: dict):
        self._writer = SummaryWriter(str(workdir / "tensorboard"), purge_step=last_step + 1)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(tag(key), value, step)

    def text(self, step: int, name: str, text: str) -> None:
        self._writer.add_text(name, text, step)

    def close(self) -> None:
        self._writer.close()


class _Wandb:
    """A W&B run under DIR/wandb/, offline unless WANDB_MODE says otherwise; a resumed run
    continues the same W&B run (its id is kept in DIR/wandb_run_id)."""

    def __init__(self, workdir: Path, last_step: int, config: dict):
        try:
            import wandb
        except ImportError:
            raise LoggingBackendError(
                "config.logging.backends includes wandb, but wandb is not installed: "
                "pip install 'ibpo-jax[wandb]' (or drop wandb from the list)") from None
        id_file = workdir / "wandb_run_id"
        if not id_file.exists():
            id_file.write_text(wandb.util.generate_id())
        self._wandb = wandb
        self._run = wandb.init(dir=str(workdir), id=id_file.read_text().strip(), resume="allow",
                               project=os.environ.get("WANDB_PROJECT", "ibpo-jax"),
                               mode=os.environ.get("WANDB_MODE", "offline"), config=config)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._run.log({tag(k): v for k, v in values.items()}, step=step)

    def text(self, step: int, name: str, text: str) -> None:
        self._run.log({name: self._wandb.Html(f"<pre>{html.escape(text)}</pre>")}, step=step)

    def close(self) -> None:
        self._run.finish()


# config.logging.backends -> writer (jsonl is RunLog's own metrics.jsonl).
BACKENDS = {"tensorboard": _TensorBoard, "wandb": _Wandb}


def open_backends(names: Sequence[str], workdir: Path, last_step: int, config: dict) -> list:
    """The writers of backends `names` (config.logging.backends, "jsonl" skipped)."""
    unknown = [n for n in names if n != "jsonl" and n not in BACKENDS]
    if unknown:
        raise LoggingBackendError(f"config.logging.backends: unknown {', '.join(unknown)}; "
                                  f"valid: jsonl, {', '.join(BACKENDS)}")
    return [BACKENDS[n](workdir, last_step, config) for n in names if n != "jsonl"]


def sample_text(rows: Sequence[dict]) -> str:
    """Evaluation samples (`evaluation.sample_rows`) as markdown for TensorBoard's text tab."""
    parts = []
    for i, r in enumerate(rows):
        first = (f", first wrong step {r['first_wrong_step']}" if "first_wrong_step" in r
                 else "")
        # Indented: markdown shows the prompt and response verbatim.
        body = "\n".join("    " + line for line in (r["prompt"] + r["response"]).splitlines())
        parts.append(f"**sample {i}**: reward {r['reward']:g}, "
                     f"{'correct' if r['correct'] else 'wrong'}{first}\n\n{body}")
    return "\n\n".join(parts)


class RunLog:
    """Writes metrics rows to metrics.jsonl and the other backends, per-step records to their
    own jsonl, and drives the progress bar."""

    def __init__(self, workdir: str | Path, *, total_steps: int, last_step: int,
                 progress: bool, is_main: bool = True,
                 backends: Sequence[str] = ("tensorboard", "jsonl"),
                 max_prompt_len: int | None = None, config: dict | None = None):
        """`last_step`: the step restored from a checkpoint, or -1 for a fresh run. backends:
        config.logging.backends' names; max_prompt_len: named by the truncation warning;
        config: the run's, for W&B."""
        self.workdir = Path(workdir)
        self.is_main = is_main
        self.path = self.workdir / "metrics.jsonl"
        self.max_prompt_len = max_prompt_len
        self._backends = []
        self._warned_truncation = False
        self._bar = None
        if not is_main:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        # First: a backend that cannot start leaves the workdir's files as they were.
        self._backends = open_backends(backends, self.workdir, last_step, config or {})
        for path in (self.path, *(self.workdir / name for name in RECORDS)):
            _truncate_after(path, last_step)
        self._file = open(self.path, "a")
        if progress:  # smoothing 0: the ETA's rate is the mean over the timed steps
            self._bar = tqdm.tqdm(total=total_steps, initial=max(last_step, 0), desc="rl",
                                  dynamic_ncols=True, file=sys.stderr, smoothing=0)
            self._timed = False  # whether the bar's clock runs from a step after compiles

    @classmethod
    def for_run(cls, cfg: Any, workdir: str | Path, *, last_step: int, is_main: bool
                ) -> RunLog:
        """The log of a run with config `cfg` (a RunConfig): its steps, bar and backends."""
        return cls(workdir, total_steps=cfg.train.steps, last_step=last_step,
                   progress=cfg.train.progress, is_main=is_main, backends=cfg.logging.names(),
                   max_prompt_len=cfg.rollout.max_prompt_len, config=cfg.to_dict())

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.is_main:
            return
        row = {"step": step, **{k: _jsonable(v) for k, v in sorted(metrics.items())}}
        self._file.write(_line(row, self.path.name))
        self._file.flush()
        scalars = {k: v for k, v in row.items() if k != "step"
                   and isinstance(v, (int, float)) and not isinstance(v, bool)}
        for backend in self._backends:
            backend.scalars(step, scalars)
        self._warn_truncation(step, row.get("prompts_truncated"))
        if self._bar is not None:
            shown = {short: f"{row[k]:.3f}" for k, short in _BAR_KEYS
                     if isinstance(row.get(k), (int, float))}
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(step - self._bar.n)
            if not self._timed:  # the ETA leaves out the base evaluation and the compiles of
                self._timed = step > 0  # the first step of this start or resume
                self._bar.initial, self._bar.start_t = self._bar.n, time.time()

    def record(self, name: str, row: dict[str, Any]) -> None:
        """Appends `row` (with its "step") to the record file `name`, one of RECORDS."""
        if name not in RECORDS:
            raise ValueError(f"record file {name!r}: not one of {', '.join(RECORDS)}")
        if self.is_main:
            with open(self.workdir / name, "a") as f:
                f.write(_line(row, name))

    def samples(self, step: int, benchmark: str, rows: Sequence[dict]) -> None:
        """Evaluation samples (`evaluation.sample_rows`) of `benchmark` at `step`: to
        samples.jsonl and as text (tag samples/<benchmark>) on the other backends."""
        if not self.is_main or not rows:
            return
        for row in rows:
            self.record("samples.jsonl", {"step": step, "benchmark": benchmark, **row})
        for backend in self._backends:
            backend.text(step, f"samples/{benchmark}", sample_text(rows))

    def _warn_truncation(self, step: int, count: Any) -> None:
        """One line, the first time a step's prompts were cut (metrics.jsonl counts them all)."""
        if self._warned_truncation or not isinstance(count, (int, float)) or count <= 0:
            return
        self._warned_truncation = True
        self.info(f"warning: {count:g} prompt(s) of step {step} were longer than "
                  f"config.rollout.max_prompt_len={self.max_prompt_len} tokens and were cut "
                  "from the left; raise it (--config.rollout.max_prompt_len=...) to keep them "
                  "whole (shown once; prompts_truncated in metrics.jsonl counts every step)")

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
        if self.is_main:
            for backend in self._backends:
                backend.close()
            if hasattr(self, "_file"):
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
