"""Atomic, resumable checkpoints of a run (orbax).

A checkpoint holds the train state pytree (params, optimizer state, step) and a JSON record
(step, data position, the run's config). Orbax writes each step into a temporary directory
and renames it when complete, so a run killed mid-save leaves the previous checkpoint intact;
`keep` bounds how many are kept. The per-step RNG is derived from (seed, step), so it needs
no saving: a resumed run draws exactly the keys an uninterrupted one would.

A checkpoint can still be damaged after it was committed (a file deleted or cut short by a
full disk, a copy, a crash of the storage): `restore_latest` then falls back to the newest
intact one, says which it skipped and why, and moves the damaged step directories aside
(``checkpoints_skipped/``) so the run can save those steps again. A checkpoint whose arrays
do not fit the state being restored (another model or optimizer) is not damage: it raises
`CheckpointMismatch` naming the first leaves that differ.

A step may also hold host arrays beside the state (`save`'s `arrays`: an off-policy run's
pending batch, trainer/offpolicy.py), one .npz in the step directory (`ARRAYS_FILE`) that the
JSON record names rather than holds.

A save that cannot complete (no space, no permission, an I/O error) stops the run with one
line (`CheckpointSaveError`: the step, the directory, the bytes a checkpoint needs and those
free, the checkpoint the run resumes from) instead of orbax's thread tracebacks, which go to
`<workdir>/checkpoint_errors.log`; its temporary step directory is removed, and so are those a
killed save left behind, when the run's Checkpointer opens (the run holds its workdir's lock).
Free space is checked before every save (all processes decide together) and when the run
starts (`check_space`): a run that cannot save even once is refused before it trains.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from ibpo_jax.runtime import hostmem, sharding
from ibpo_jax.trainer.errors import RunError

_SHOWN = 3  # mismatched leaves named in an error
ARRAYS = "arrays"  # the step's item of host arrays beside the state
ARRAYS_FILE = f"{ARRAYS}/arrays.npz"  # its file, relative to the step directory


class CheckpointError(RunError):
    """No checkpoint of the directory can be read."""


class CheckpointSaveError(RunError):
    """A checkpoint could not be written (space, permission, I/O): the run stops, resumable from
    its last complete checkpoint."""


TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's temporary step directories
ERRORS_FILE = "checkpoint_errors.log"  # beside the checkpoints: what orbax said of a failure
SPACE_MARGIN = 1.1  # a checkpoint's bytes on disk over its arrays' (metadata, alignment)
SPACE_SLACK = 1 << 20
DRAIN_S = 5.0  # after a failed save: time for its pending writes to fail (into the log)


def tree_bytes(tree: Any) -> int:
    """Bytes of the arrays of `tree` (global arrays: every shard, over all processes)."""
    return int(sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(tree)))


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class CheckpointMismatch(RunError):
    """A readable checkpoint whose arrays do not fit the state to restore; `meta` is its
    record (its config names what was trained)."""

    def __init__(self, message: str, *, step: int, meta: dict[str, Any]):
        super().__init__(message)
        self.step, self.meta = step, meta


def _leaf_name(path: tuple) -> str:
    """"params.layers.0.kernel": the same for a live pytree (namedtuples: attribute keys) and
    orbax's stored tree metadata (dicts and lists)."""
    parts = []
    for k in path:
        parts.append(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))))
    return ".".join(parts)


def _shapes(tree: Any) -> dict[str, tuple[int, ...] | None]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {_leaf_name(p): tuple(getattr(x, "shape", ()) or ()) for p, x in leaves}


def tree_mismatch(saved: Any, target: Any) -> list[str]:
    """How the stored state tree `saved` differs from `target`: leaves only one side has, and
    shapes that differ (empty: they fit); parameters first, the optimizer state mirrors them."""
    a, b = _shapes(saved), _shapes(target)
    order = lambda keys: sorted(keys, key=lambda k: (not k.startswith("params."), k))
    out = [f"{k}: shape {a[k]} in the checkpoint, {b[k]} here"
           for k in order(a.keys() & b.keys()) if a[k] != b[k]]
    out += [f"{k}: only in the checkpoint" for k in order(a.keys() - b.keys())]
    out += [f"{k}: not in the checkpoint" for k in order(b.keys() - a.keys())]
    return out


def _read_only_notice(record: logging.LogRecord) -> bool:
    """False for orbax's notice that a read-only manager's directory is read only: the resume
    checks and evaluation open one on purpose, and a warning per start reads like a fault."""
    return not str(record.msg).startswith("Given directory is read only")


# What an I/O failure's text says, in words (tensorstore's messages quote paths and specs).
_IO_CAUSES = (("No space left on device", "no space left on device"),
              ("Permission denied", "permission denied"),
              ("Read-only file system", "read-only file system"),
              ("Disk quota exceeded", "disk quota exceeded"),
              ("Input/output error", "I/O error"),
              ("File too large", "a file over the process's size limit, ulimit -f"))


def _reason(error: Exception) -> str:
    """One short line for an orbax / tensorstore error (theirs run to pages of specs)."""
    text = str(error).strip()
    if cause := next((words for key, words in _IO_CAUSES if key in text), None):
        return cause
    lines = text.splitlines()
    return f"{type(error).__name__}: {(lines[0] if lines else '')[:160]}"


class Checkpointer:
    """Saves every `every` steps into `directory`, keeping the last `keep`.

    `read_only` (evaluation of a possibly live run) never creates, deletes or cleans anything:
    the temporary directory of a save in progress is left alone.
    """

    def __init__(self, directory: str | Path, *, every: int = 1, keep: int = 1,
                 read_only: bool = False):
        self.directory = Path(directory).absolute()
        self.every = every
        self._read_only = read_only
        # (step, arrays) read by `restore_latest` to judge the step intact, handed to the
        # first `arrays(step)` after it instead of a second read of the file.
        self._checked: tuple[int, dict[str, np.ndarray]] | None = None
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None if read_only else keep,
            save_interval_steps=0 if read_only else 1,  # orbax warns when it sets this itself
            create=not read_only,
            read_only=read_only,
            # Synchronous saves: the next step donates the buffers that are being written.
            enable_async_checkpointing=False,
            cleanup_tmp_directories=not read_only,  # leftovers of a run killed mid-save
        )
        absl_log = logging.getLogger("absl")  # orbax's: it warns on every read-only manager
        absl_log.addFilter(_read_only_notice)
        if not read_only:
            self._remove_partial()  # a killed or failed save's leftovers block no start
        try:
            self._manager = ocp.CheckpointManager(self.directory, options=options)
        finally:
            absl_log.removeFilter(_read_only_notice)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def path(self, step: int) -> Path:
        return self.directory / str(step)

    def latest_meta(self, steps: list[int] | None = None) -> tuple[int, dict[str, Any]] | None:
        """(step, record) of the newest checkpoint (of `steps`, default all) whose JSON
        record reads."""
        for step in sorted(self._manager.all_steps() if steps is None else steps, reverse=True):
            try:
                return step, self.meta(step)
            except Exception:  # damaged: restore_latest reports it
                continue
        return None

    def should_save(self, step: int, *, last: bool) -> bool:
        return last or step % self.every == 0

    def save(self, step: int, state: Any, meta: dict[str, Any],
             arrays: dict[str, np.ndarray] | None = None) -> None:
        """Saves `state`, the JSON record `meta` and, if any, the host `arrays` (ARRAYS_FILE)
        as step `step`, all at once: orbax writes the items into a temporary step directory
        and commits it complete, so a run killed mid-save never leaves a record without its
        arrays (the previous checkpoint stays the latest). Raises CheckpointSaveError, before
        writing when the space is short (every process decides together), or when the write
        fails (its temporary directory removed)."""
        self._checked = None  # a resumed run that never asked for its arrays: not kept
        need, measured = self.bytes_needed(state, arrays)
        # Refused ahead only against a measured size (a committed checkpoint's): the first
        # save's is an upper bound (orbax compresses), so it is tried, and caught if it fails.
        if measured and sharding.process_max(np.array([self.free_bytes() < need], np.int32))[0]:
            raise CheckpointSaveError(self._failed(step, need, "not enough free space"))
        items = {"state": ocp.args.StandardSave(state)}
        if arrays is not None:  # named in the record: a restore checks that the file reads
            meta, items[ARRAYS] = {**meta, ARRAYS: ARRAYS_FILE}, NpzSave(arrays)
        try:
            with self._orbax_errors_to_file():
                self._manager.save(step, args=ocp.args.Composite(
                    **items, meta=ocp.args.JsonSave(meta)))
                self._manager.wait_until_finished()
        except Exception as e:
            self._remove_partial(step)
            raise CheckpointSaveError(self._failed(step, need, _reason(e))) from None
        finally:
            if jax.default_backend() == "cpu":  # the host copy's memory, back to the system
                hostmem.return_freed_memory()

    def bytes_needed(self, state: Any, arrays: dict[str, np.ndarray] | None = None
                     ) -> tuple[int, bool]:
        """(disk bytes of one checkpoint, measured): the newest committed checkpoint's size
        with a margin when there is one, else its arrays' bytes with a margin (an upper bound:
        orbax compresses)."""
        latest = self._manager.latest_step()
        if latest is not None and self.path(latest).is_dir():
            size = sum(f.stat().st_size for f in self.path(latest).rglob("*") if f.is_file())
            return int(size * SPACE_MARGIN) + SPACE_SLACK, True
        raw = tree_bytes(state) + tree_bytes(arrays or {})
        return int(raw * SPACE_MARGIN) + SPACE_SLACK, False

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.directory if self.directory.exists()
                                 else self.directory.parent).free

    def check_space(self, state: Any, keep: int, log: Callable[[str], None]) -> None:
        """At start-up: refuses a resumed run whose checkpoints no longer fit
        (CheckpointSaveError), and says so when the space holds fewer than the `keep`
        checkpoints the run keeps plus the one being written."""
        need, measured = self.bytes_needed(state)
        free = self.free_bytes()
        if measured and sharding.process_max(np.array([free < need], np.int32))[0]:
            raise CheckpointSaveError(
                f"{self.directory} has {human(free)} free, and a checkpoint of this run takes "
                f"{human(need)}: free space there before resuming")
        if free < need * (keep + 1):
            size = human(need) if measured else f"up to {human(need)}"
            log(f"warning: {self.directory} has {human(free)} free; this run keeps {keep} "
                f"checkpoint(s) of {size} and writes one more while saving: a save that "
                "does not fit will stop the run, resumable")

    def _failed(self, step: int, need: int, why: str) -> str:
        last = self._manager.latest_step()
        resume = (f"it resumes from {self.path(last)} (step {last})" if last is not None
                  else "no checkpoint was written yet, so it starts over")
        log = self.directory.parent / ERRORS_FILE
        return (f"checkpoint of step {step} failed ({why}): it needs {human(need)} in "
                f"{self.directory}, {human(self.free_bytes())} free; rerun the same command "
                f"once that is fixed: {resume}" + (f" (details: {log})" if log.exists() else ""))

    @contextlib.contextmanager
    def _orbax_errors_to_file(self):
        """What a failing save prints goes to ERRORS_FILE, not the terminal: orbax's threads
        log the failure with pages of traceback (absl), and tensorstore's pending writes,
        failing after the save's event loop closed, print theirs to sys.stderr for a while
        after (waited for, DRAIN_S), or to asyncio's logger when collected (kept in the file
        for the rest of the process: the run stops)."""
        absl_log = logging.getLogger("absl")
        path = self.directory.parent / ERRORS_FILE
        handler = logging.FileHandler(path, delay=True)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        propagate, absl_log.propagate = absl_log.propagate, False
        absl_log.addHandler(handler)
        stderr, sink = sys.stderr, _LazyFile(path)
        sys.stderr = sink
        try:
            yield
        except BaseException:
            time.sleep(DRAIN_S)  # the failed writes' callbacks, still printing
            # Tasks whose failure nobody retrieved report it through asyncio's logger when
            # they are collected, possibly at exit (seen on a loaded host): to the file too.
            _asyncio_errors_to(path)
            raise
        finally:
            sys.stderr = stderr
            absl_log.removeHandler(handler)
            absl_log.propagate = propagate
            handler.close()
            sink.close()

    def _remove_partial(self, step: int | None = None) -> None:
        """Removes orbax's temporary step directories (of `step`, default every one) from the
        first process: a failed or killed save's, never a committed checkpoint."""
        if jax.process_index() != 0 or not self.directory.is_dir():
            return
        for tmp in self.directory.glob(f"{'' if step is None else step}*{TMP_SUFFIX}*"):
            if tmp.is_dir() and (step is None or tmp.name.split(".")[0] == str(step)):
                shutil.rmtree(tmp, ignore_errors=True)

    def arrays(self, step: int) -> dict[str, np.ndarray]:
        """The host arrays saved with `step` (`save`'s `arrays`), by name."""
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] == step:
            return checked[1]
        return self._manager.restore(
            step, args=ocp.args.Composite(**{ARRAYS: NpzRestore()}))[ARRAYS]

    def meta(self, step: int) -> dict[str, Any]:
        """The JSON record of `step` alone (step, data position, config)."""
        return self._manager.restore(
            step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

    def restore(self, step: int, target: Any) -> tuple[Any, dict[str, Any]]:
        """Restores into the structure, shapes, dtypes and shardings of `target`."""
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target
        )
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
            ),
        )
        return restored.state, restored.meta

    def _check_fits(self, step: int, abstract: Any, meta: dict[str, Any]) -> None:
        """Raises CheckpointMismatch when the stored tree metadata of `step` reads and differs
        from `abstract` (unreadable metadata is left to the restore to judge)."""
        try:  # the handler directly: a fresh manager knows no handler for "state" yet
            saved = ocp.StandardCheckpointHandler().metadata(self.path(step) / "state")
            saved = getattr(saved, "tree", saved)
        except Exception:
            return
        if saved is None:
            return
        diff = tree_mismatch(saved, abstract)
        if diff:
            more = f" (and {len(diff) - _SHOWN} more)" if len(diff) > _SHOWN else ""
            raise CheckpointMismatch(
                f"checkpoint {self.path(step)} does not fit this state: "
                f"{'; '.join(diff[:_SHOWN])}{more}", step=step, meta=meta)

    def _try_restore(self, step: int, target: Any) -> tuple[Any, dict[str, Any]]:
        try:
            meta = self.meta(step)
        except Exception as e:
            raise _Damaged(_reason(e)) from e
        self._check_fits(step, target, meta)
        try:
            if meta.get(ARRAYS):  # saved with arrays: a step whose arrays do not read is damaged
                self._checked = (step, self.arrays(step))
            return self.restore(step, target)
        except Exception as e:
            raise _Damaged(_reason(e)) from e

    def restore_latest(self, target: Any, *, log: Callable[[str], None],
                       steps: list[int] | None = None) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, record) of the newest intact checkpoint (of `steps`, default all),
        None when there is none at all; damaged ones are skipped (logged with the reason) and,
        unless read-only, moved to checkpoints_skipped/. Raises CheckpointError when every
        checkpoint is damaged."""
        skipped = []
        for step in sorted(self._manager.all_steps() if steps is None else steps, reverse=True):
            try:
                state, meta = self._try_restore(step, target)
            except _Damaged as e:
                log(f"skipping damaged checkpoint {self.path(step)} ({e})")
                skipped.append((step, str(e)))
                continue
            self._set_aside([s for s, _ in skipped])
            return step, state, meta
        if skipped:
            raise CheckpointError("no intact checkpoint: " + "; ".join(
                f"{self.path(s)}: {why}" for s, why in skipped))
        return None

    def _set_aside(self, steps: list[int]) -> None:
        """Moves damaged step directories out of the manager's sight (a later save of the
        same step would otherwise collide with them)."""
        if not steps or self._read_only:
            return
        if jax.process_index() == 0:
            aside = self.directory.parent / f"{self.directory.name}_skipped"
            aside.mkdir(exist_ok=True)
            for step in steps:
                dest = aside / str(step)
                if dest.exists():
                    shutil.rmtree(dest)
                shutil.move(str(self.path(step)), dest)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("checkpoint_set_aside")
        self._manager.reload()

    def close(self) -> None:
        self._manager.close()


def _asyncio_errors_to(path: Path) -> None:
    """asyncio's logger into `path` from now on, instead of the terminal (one such file a
    process: the last failed save's)."""
    log = logging.getLogger("asyncio")
    for old in [h for h in log.handlers if getattr(h, "ibpo_checkpoint_errors", False)]:
        log.removeHandler(old)
        old.close()
    handler = logging.FileHandler(path, delay=True)
    handler.ibpo_checkpoint_errors = True
    log.addHandler(handler)
    log.propagate = False


class _LazyFile:
    """A text sink that creates its file on the first write only: a save that succeeds leaves
    no empty ERRORS_FILE behind."""

    def __init__(self, path: Path):
        self.path, self._file = path, None

    def write(self, text: str) -> int:
        if self._file is None:
            self._file = open(self.path, "a")  # noqa: SIM115 (closed by `close`)
        return self._file.write(text)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class _Damaged(Exception):
    """A checkpoint that cannot be read; the message is the reason."""


class NpzHandler(ocp.CheckpointHandler):
    """A dict of host arrays as one .npz in its item directory (exact: dtypes and bits kept).
    Written, like the JSON record, into orbax's temporary step directory (committed whole)."""

    def save(self, directory: Any, args: NpzSave) -> None:
        if jax.process_index() == 0:  # the arrays are the same on every process
            with (directory / Path(ARRAYS_FILE).name).open("wb") as f:
                np.savez(f, **args.arrays)  # uncompressed: MBs beside a GB state, no wait

    def restore(self, directory: Any, args: NpzRestore | None = None) -> dict[str, np.ndarray]:
        with (directory / Path(ARRAYS_FILE).name).open("rb") as f, np.load(f) as z:
            return {k: z[k] for k in z.files}


@ocp.args.register_with_handler(NpzHandler, for_save=True)
@dataclasses.dataclass
class NpzSave(ocp.args.CheckpointArgs):
    arrays: dict[str, np.ndarray]


@ocp.args.register_with_handler(NpzHandler, for_restore=True)
@dataclasses.dataclass
class NpzRestore(ocp.args.CheckpointArgs):
    pass
