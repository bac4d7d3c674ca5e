"""What a workdir guarantees about the run it holds: one run at a time, a truthful record of
the config its checkpoints were trained with, resume from the newest intact checkpoint, and a
stop when the updates have stopped being applied.

- `RunLock`: an exclusive `fcntl.flock` on ``<workdir>/run.lock``. The kernel drops it when the
  holder's file descriptor closes, so a SIGKILLed run never leaves a stale lock; the file
  records the holder (pid, host, start time) for the message a second run exits with.
- Config on resume: the config stored in the restored checkpoint is compared key by key with
  the new one. A change that alters how the checkpoints are trained is refused unless
  ``train.allow_config_change``; an accepted change is appended, with its step, to
  ``config_history.jsonl``, and ``config.json`` keeps the config the run started with.
- `StallGuard`: K steps in a row whose updates were all skipped as non-finite stop the run
  (the loop would otherwise go on and export the weights of a run that stopped learning).
- `StopRequest`: SIGINT / SIGTERM finish the current step and checkpoint it, then the run stops
  (`RunStopped`, the entry point says how to resume); a second signal exits at once.
- Extending a run: raising train.steps (under a constant schedule) or changing when it
  evaluates, checkpoints or stops (`OPERATIONAL_KEYS`) is accepted on resume and recorded.

Every error here is a `RunError` (trainer/errors.py): one line that names its culprit
(workdir, config key, checkpoint); the entry points print it without a traceback.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ibpo_jax.trainer.checkpoint import Checkpointer, CheckpointMismatch
from ibpo_jax.trainer.errors import RunError

LOCK_FILE = "run.lock"
HISTORY_FILE = "config_history.jsonl"
# Keys that say where or how a run executes, not what it trains: free to change on resume.
# (mesh: sharded reductions differ by float rounding only, tests/trainer/test_loop.py.)
OPERATIONAL_KEYS = frozenset({
    "train.progress", "train.distributed", "train.heartbeat_s", "train.allow_config_change",
    "task.data_dir",
    "warm_start.cache_dir", "warm_start.search_path", "reward.num_workers", "mesh.data",
    "mesh.fsdp", "mesh.tensor", "logging.backends", "logging.samples",
    # Extending or re-pacing a run: when it stops, evaluates and checkpoints, not what a step
    # computes (the bitwise-resume guarantee covers the steps both configs run).
    "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints", "train.budget",
})
# train.steps sets the cosine schedule's horizon: operational only under a constant schedule.
_STEPS_KEY = "train.steps"
MAX_STALLED_STEPS = 3  # consecutive steps with every update skipped before the run stops
_ABSENT = "<absent>"


class WorkdirInUse(RunError):
    """Another live process holds the workdir's lock."""


class ConfigChanged(RunError):
    """The config differs from the one the checkpoint being resumed was trained with."""


class UpdatesStalled(RunError):
    """Several steps in a row had every update skipped as non-finite."""


class RunStopped(Exception):
    """The run stopped on a signal after checkpointing `step` (`StopRequest`): not an error,
    the entry point prints how to resume."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step} "
                         f"(checkpoint {checkpoint})")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint


class StopRequest:
    """SIGINT / SIGTERM while the loop runs (a context manager): the first asks the loop to
    finish its step, checkpoint it and stop (`requested`); a second exits at once, the last
    checkpoint standing. Outside the main thread (signals cannot be caught there) it does
    nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:  # os.write: safe inside a handler, unlike print
            os.write(_stderr_fd(),
                     f"\n{name} again: exiting now (the last checkpoint stands)\n".encode())
            os._exit(128 + signum)
        self.signum = signum
        os.write(_stderr_fd(), f"\n{name}: finishing this step, then a checkpoint and a stop "
                               "(send it again to exit at once)\n".encode())

    def requested(self) -> bool:
        """Whether to stop after this step; every process agrees (a collective when there are
        several: a signal may reach only some of them)."""
        import jax  # here: train.py checks the workdir before jax starts

        if jax.process_count() == 1:
            return self.signum is not None
        import numpy as np

        from ibpo_jax.runtime import sharding

        flag = sharding.process_max(np.array([self.signum or 0], np.int64))[0]
        if flag and self.signum is None:
            self.signum = int(flag)
        return bool(flag)


def _stderr_fd() -> int:
    """sys.stderr's file descriptor: the terminal, also where fd 2 goes to a log
    (trainer/supervisor.py); 2 where sys.stderr has none (a test's capture)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


class RunLock:
    """Exclusive lock of a workdir for one run (a context manager); `enabled=False` (processes
    other than the first of a multi-host run) holds nothing."""

    def __init__(self, workdir: str | Path, *, enabled: bool = True):
        self.path = Path(workdir).absolute() / LOCK_FILE
        self.enabled = enabled
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if not self.enabled:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Opened without truncation: the holder's record must survive our failed attempt.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            raise WorkdirInUse(f"workdir {self.path.parent} is in use by another run "
                               f"({_describe_holder(holder)}; lock file {self.path})") from None
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": _now()}) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        # The file stays: unlinking it would let a later run lock a new inode while a waiter
        # still holds the old one open.
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _describe_holder(text: str) -> str:
    try:
        h = json.loads(text)
        return f"pid {h['pid']} on host {h['host']}, started {h['started']}"
    except (ValueError, KeyError, TypeError):  # a holder still writing its record
        return "holder not recorded yet"


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 1e-5}} -> {"optim.lr": 1e-5}; tuples as JSON lists (checkpoints store
    the config as JSON)."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.loads(json.dumps(value))
    return flat


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (old value, new value)} for every key whose value differs (a key only one
    side has shows "<absent>" on the other)."""
    a, b = flatten(old), flatten(new)
    return {k: (a.get(k, _ABSENT), b.get(k, _ABSENT)) for k in sorted(a.keys() | b.keys())
            if a.get(k, _ABSENT) != b.get(k, _ABSENT)}


def describe(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k}: {json.dumps(o)} -> {json.dumps(n)}" for k, (o, n) in changes.items())


def check_config(saved: dict[str, Any], cfg: Any, *, where: str) -> dict[str, tuple[Any, Any]]:
    """The changes from `saved` (the config of checkpoint `where`) to `cfg`; raises
    ConfigChanged naming them when any alters training and the config does not allow it."""
    changes = config_changes(saved, cfg.to_dict())
    training = {k: v for k, v in changes.items() if not _operational(k, cfg)}
    if training and not cfg.train.allow_config_change:
        raise ConfigChanged(
            f"the config differs from the one checkpoint {where} was trained with "
            f"({describe(training)}); resume with the same config, use another --workdir, or "
            "pass --config.train.allow_config_change=true to continue (the change is appended "
            f"to {HISTORY_FILE})")
    return changes


def _operational(key: str, cfg: Any) -> bool:
    """Whether changing `key` on resume leaves what the steps train unchanged."""
    if key == _STEPS_KEY:
        return cfg.optim.schedule == "constant"
    return key in OPERATIONAL_KEYS


def record_config(workdir: Path, cfg: Any, *, step: int | None,
                  changes: dict[str, tuple[Any, Any]]) -> None:
    """config.json for a fresh run (or a workdir that lacks it); on resume, a row of
    config_history.jsonl per changed config: {"step", "time", "changes", "config"}."""
    if step is None or not (workdir / "config.json").exists():
        (workdir / "config.json").write_text(cfg.to_json())
    if step is not None and changes:
        row = {"step": step, "time": _now(),
               "changes": {k: {"old": o, "new": n} for k, (o, n) in changes.items()},
               "config": flatten(cfg.to_dict())}
        with open(workdir / HISTORY_FILE, "a") as f:
            f.write(json.dumps(row) + "\n")


def check_latest_config(directory: Path, cfg: Any) -> None:
    """Before anything is built: refuses a changed config against the newest checkpoint in
    `directory` whose record reads (`resume` checks again against the one it restores)."""
    if not directory.is_dir() or not any(directory.iterdir()):
        return
    checkpointer = Checkpointer(directory, read_only=True)
    try:
        found = checkpointer.latest_meta()
    finally:
        checkpointer.close()
    if found is not None:
        step, meta = found
        check_config(meta["config"], cfg, where=str(checkpointer.path(step)))


def resume(checkpointer: Any, cfg: Any, target: Any, workdir: Path, *,
           log: Callable[[str], None], record: bool) -> tuple[int, Any, dict] | None:
    """(step, state, record) of the newest intact checkpoint, or None for a fresh run; checks
    the config against that checkpoint's and (record=True: the first process) writes the
    config record. A state that does not fit the checkpoint names the changed config keys."""
    try:
        found = checkpointer.restore_latest(target, log=log)
    except CheckpointMismatch as e:
        changes = config_changes(e.meta.get("config", {}), cfg.to_dict())
        culprits = (f"config keys changed since it was saved: {describe(changes)}" if changes
                    else "no config key differs from the checkpoint's")
        raise ConfigChanged(f"{e} ({culprits})") from None
    checkpointer.check_space(target, cfg.train.keep_checkpoints, log)  # before training
    if found is None:
        if record:
            record_config(workdir, cfg, step=None, changes={})
        return None
    step, state, meta = found
    changes = check_config(meta["config"], cfg, where=str(checkpointer.path(step)))
    if changes:
        log(f"resuming with a changed config ({describe(changes)}); recorded in {HISTORY_FILE}")
    if record:
        record_config(workdir, cfg, step=step, changes=changes)
    return step, state, meta


class StallGuard:
    """Stops the run after `limit` consecutive steps in which every one of the step's
    `updates_per_step` optimizer updates was skipped as non-finite (step.update's
    ``updates_skipped_nonfinite``): the parameters no longer move, and exporting them would
    present a stalled run as a finished one."""

    KEY = "updates_skipped_nonfinite"

    def __init__(self, updates_per_step: int, limit: int = MAX_STALLED_STEPS):
        self.updates_per_step = updates_per_step
        self.limit = limit
        self.stalled = 0

    def check(self, step: int, metrics: dict[str, Any]) -> None:
        skipped = metrics.get(self.KEY, 0)
        self.stalled = self.stalled + 1 if skipped >= self.updates_per_step else 0
        if self.stalled >= self.limit:
            raise UpdatesStalled(
                f"steps {step - self.limit + 1}-{step}: all {self.updates_per_step} updates of "
                f"each step were skipped ({self.KEY}): the loss, gradients or updated "
                "parameters are non-finite; stopping without exporting the weights (lower "
                "config.optim.lr, raise config.optim.grad_clip, or check the data)")
