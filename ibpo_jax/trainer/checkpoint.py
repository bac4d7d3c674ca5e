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
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from ibpo_jax.trainer.errors import RunError

_SHOWN = 3  # mismatched leaves named in an error
ARRAYS = "arrays"  # the step's item of host arrays beside the state
ARRAYS_FILE = f"{ARRAYS}/arrays.npz"  # its file, relative to the step directory


class CheckpointError(RunError):
    """No checkpoint of the directory can be read."""


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


def _reason(error: Exception) -> str:
    """One short line for an orbax / tensorstore error (theirs run to pages of specs)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {(text[0] if text else '')[:160]}"


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
        arrays (the previous checkpoint stays the latest)."""
        self._checked = None  # a resumed run that never asked for its arrays: not kept
        items = {"state": ocp.args.StandardSave(state)}
        if arrays is not None:  # named in the record: a restore checks that the file reads
            meta, items[ARRAYS] = {**meta, ARRAYS: ARRAYS_FILE}, NpzSave(arrays)
        self._manager.save(step, args=ocp.args.Composite(**items, meta=ocp.args.JsonSave(meta)))
        self._manager.wait_until_finished()

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
