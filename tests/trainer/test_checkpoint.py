"""A damaged latest checkpoint (a file missing or cut short) falls back to the newest intact one,
saying which was skipped and why; none intact is an error naming the paths; a state that does
not fit a readable checkpoint is a mismatch naming the leaf, not damage."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import config
from ibpo_jax.trainer.checkpoint import (
    ARRAYS,
    ARRAYS_FILE,
    Checkpointer,
    CheckpointError,
    CheckpointMismatch,
    tree_mismatch,
)
from ibpo_jax.trainer.state import init_state, make_optimizer


def _state(scale=1.0, width=4):
    """A real train state: params, AdamW (+ clipping) state with namedtuples and empty nodes."""
    optim = config.load("configs/ibpo_gspo.py:smoke").optim
    params = {"embed": jnp.full((3, width), scale), "layers": [{"kernel": jnp.arange(width * 1.0)}]}
    return init_state(params, make_optimizer(optim, total_updates=10))


def _largest_data_file(step_dir):
    return max((p for p in (step_dir / "state").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE = {
    "data file cut short": lambda d: _truncate(_largest_data_file(d)),
    "data file missing": lambda d: _largest_data_file(d).unlink(),
    "record missing": lambda d: (d / "meta" / "metadata").unlink(),
    "tree metadata cut short": lambda d: _truncate(d / "state" / "_METADATA"),
    "state missing": lambda d: shutil.rmtree(d / "state"),
}


@pytest.fixture
def saved(tmp_path):
    ckpt = Checkpointer(tmp_path / "checkpoints", keep=3)
    for step in (2, 4, 6):
        ckpt.save(step, _state(scale=step), {"step": step, "data_position": 10 * step})
    ckpt.close()
    return tmp_path


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_latest_falls_back_to_the_newest_intact(saved, damage):
    DAMAGE[damage](saved / "checkpoints" / "6")
    logged = []
    ckpt = Checkpointer(saved / "checkpoints", keep=3)
    step, state, meta = ckpt.restore_latest(_state(), log=logged.append)
    assert (step, meta["data_position"]) == (4, 40)
    np.testing.assert_array_equal(state.params["embed"], np.full((3, 4), 4.0))
    (line,) = logged
    assert line.startswith(f"skipping damaged checkpoint {saved / 'checkpoints' / '6'} (")
    assert "\n" not in line and len(line) < 400
    # Set aside, so the resumed run can save step 6 again (it would collide otherwise).
    assert (saved / "checkpoints_skipped" / "6").is_dir()
    ckpt.save(6, jax.tree.map(lambda x: x + 1, state), {"step": 6, "data_position": 60})
    assert ckpt.latest_step() == 6 and ckpt.restore(6, _state())[1]["data_position"] == 60
    ckpt.close()


@pytest.mark.parametrize("damage", ["missing", "cut short"])
def test_a_step_whose_arrays_do_not_read_is_damaged(tmp_path, damage):
    """The off-policy pending batch is an .npz item of its step: without it the step cannot
    resume as the uninterrupted run, so the restore falls back to the step before."""
    ckpt = Checkpointer(tmp_path / "checkpoints", keep=3)
    for step in (2, 4):
        ckpt.save(step, _state(scale=step), {"step": step},
                  arrays={"tokens_0": np.full((2, 3), step, np.int32)})
    assert ckpt.meta(4)[ARRAYS] == ARRAYS_FILE
    np.testing.assert_array_equal(ckpt.arrays(4)["tokens_0"], np.full((2, 3), 4))
    ckpt.close()
    npz = tmp_path / "checkpoints" / "4" / ARRAYS_FILE
    npz.unlink() if damage == "missing" else _truncate(npz)
    logged = []
    ckpt = Checkpointer(tmp_path / "checkpoints", keep=3)
    step, _, meta = ckpt.restore_latest(_state(), log=logged.append)
    assert step == 2 and len(logged) == 1 and "checkpoints/4" in logged[0]
    ckpt.close()


def test_no_intact_checkpoint_names_every_path(saved):
    for step in (2, 4, 6):
        DAMAGE["data file cut short"](saved / "checkpoints" / str(step))
    ckpt = Checkpointer(saved / "checkpoints", read_only=True)  # evaluation: moves nothing
    with pytest.raises(CheckpointError, match="no intact checkpoint") as e:
        ckpt.restore_latest(_state(), log=lambda _: None)
    for step in (2, 4, 6):
        assert f"{saved / 'checkpoints' / str(step)}: " in str(e.value)
    assert not (saved / "checkpoints_skipped").exists()
    assert ckpt.restore_latest(_state(), log=print, steps=[]) is None
    ckpt.close()


def test_a_state_that_does_not_fit_is_a_mismatch_not_damage(saved):
    ckpt = Checkpointer(saved / "checkpoints", keep=3)
    with pytest.raises(CheckpointMismatch) as e:
        ckpt.restore_latest(_state(width=5), log=print)
    assert e.value.step == 6 and e.value.meta["data_position"] == 60
    assert "params.embed: shape (3, 4) in the checkpoint, (3, 5) here" in str(e.value)
    assert "(and " in str(e.value)  # AdamW's moments differ too: counted, not listed
    assert ckpt.latest_step() == 6 and not (saved / "checkpoints_skipped").exists()
    ckpt.close()


def test_tree_mismatch_reads_namedtuple_states_like_stored_metadata(saved):
    """Orbax stores namedtuples (TrainState, AdamW's state) as dicts and drops empty nodes:
    the leaf names must still line up, or every resume would be refused."""
    import orbax.checkpoint as ocp

    meta = ocp.StandardCheckpointHandler().metadata(saved / "checkpoints" / "4" / "state").tree
    assert tree_mismatch(meta, _state()) == []
    extra = _state()._replace(params={**_state().params, "head": jnp.ones(2)})
    assert tree_mismatch(meta, extra) == ["params.head: not in the checkpoint"]


# --- checkpoint I/O failures (issue 60) ---------------------------------------------------


def test_a_failed_save_is_one_line_removes_its_partial_directory_and_keeps_the_last(
        tmp_path, monkeypatch):
    from ibpo_jax.trainer.checkpoint import CheckpointSaveError

    ckpt = Checkpointer(tmp_path / "checkpoints", keep=3)
    ckpt.save(2, _state(2.0), {"step": 2, "data_position": 20})
    real_save = ckpt._manager.save

    def failing_save(step, **kw):  # orbax's temporary directory, then the disk is full
        (tmp_path / "checkpoints" / f"{step}.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
        raise ValueError(f"RESOURCE_EXHAUSTED: Error writing local file ... step {step}: "
                         "No space left on device [os_error_code='28']")

    monkeypatch.setattr(ckpt._manager, "save", failing_save)
    with pytest.raises(CheckpointSaveError) as e:
        ckpt.save(4, _state(4.0), {"step": 4, "data_position": 40})
    message = str(e.value)
    assert "\n" not in message and message.startswith("checkpoint of step 4 failed (no space")
    assert f"it resumes from {tmp_path / 'checkpoints' / '2'} (step 2)" in message
    assert " MiB in " in message and " free; rerun the same command" in message
    assert not list((tmp_path / "checkpoints").glob("*tmp*"))  # removed
    monkeypatch.setattr(ckpt._manager, "save", real_save)
    step, state, meta = ckpt.restore_latest(_state(0.0), log=print)
    assert step == 2 and meta["data_position"] == 20
    np.testing.assert_array_equal(state.params["embed"], np.full((3, 4), 2.0))
    ckpt.close()


def test_space_is_checked_at_start_up_and_before_each_save(tmp_path, monkeypatch):
    import collections

    from ibpo_jax.trainer import checkpoint
    from ibpo_jax.trainer.checkpoint import CheckpointSaveError

    ckpt = Checkpointer(tmp_path / "checkpoints", keep=2)
    said = []
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage(10, 10, 10))
    ckpt.check_space(_state(), 2, said.append)  # a fresh run: an upper bound, said, not refused
    assert said and "up to" in said[0] and "a save that does not fit will stop the run" in said[0]
    monkeypatch.undo()
    ckpt.save(2, _state(), {"step": 2})  # a measured size from now on
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage(10, 10, 10))
    with pytest.raises(CheckpointSaveError, match="10 B free, and a checkpoint of this run"):
        ckpt.check_space(_state(), 2, said.append)
    with pytest.raises(CheckpointSaveError, match=r"step 4 failed \(not enough free space\)"):
        ckpt.save(4, _state(), {"step": 4})
    assert ckpt.all_steps() == [2]
    ckpt.close()


def test_leftover_temporary_directories_go_when_a_run_opens_its_checkpoints(tmp_path):
    directory = tmp_path / "checkpoints"
    ckpt = Checkpointer(directory)
    ckpt.save(2, _state(), {"step": 2})
    ckpt.close()
    (directory / "4.orbax-checkpoint-tmp" / "state").mkdir(parents=True)  # a killed save
    Checkpointer(directory, read_only=True).close()  # an evaluation leaves a live save alone
    assert (directory / "4.orbax-checkpoint-tmp").exists()
    Checkpointer(directory).close()
    assert not (directory / "4.orbax-checkpoint-tmp").exists() and (directory / "2").is_dir()
