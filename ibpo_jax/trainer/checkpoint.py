"""Atomic, resumable checkpoints of a run (orbax).

A checkpoint holds the train state pytree (params, optimizer state, step) and a JSON record
(step, data position, the run's config). Orbax writes each step into a temporary directory
and renames it when complete, so a run killed mid-save leaves the previous checkpoint intact;
`keep` bounds how many are kept. The per-step RNG is derived from (seed, step), so it needs
no saving: a resumed run draws exactly the keys an uninterrupted one would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    """Saves every `every` steps into `directory`, keeping the last `keep`.

    `read_only` (evaluation of a possibly live run) never creates, deletes or cleans anything:
    the temporary directory of a save in progress is left alone.
    """

    def __init__(self, directory: str | Path, *, every: int = 1, keep: int = 1,
                 read_only: bool = False):
        self.directory = Path(directory).absolute()
        self.every = every
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None if read_only else keep,
            create=not read_only,
            read_only=read_only,
            # Synchronous saves: the next step donates the buffers that are being written.
            enable_async_checkpointing=False,
            cleanup_tmp_directories=not read_only,  # leftovers of a run killed mid-save
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def should_save(self, step: int, *, last: bool) -> bool:
        return last or step % self.every == 0

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
        )
        self._manager.wait_until_finished()

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

    def close(self) -> None:
        self._manager.close()
