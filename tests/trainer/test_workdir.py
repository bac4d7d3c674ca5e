"""One run per workdir (flock: a second run exits naming the holder; a SIGKILLed holder leaves
no stale lock), the config record on resume (refused by default, appended to
config_history.jsonl when allowed), torn metrics lines, the stalled-updates stop, and the entry
point's one-line errors."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import pytest

from ibpo_jax import config
from ibpo_jax.trainer import loop, workdir
from ibpo_jax.trainer.checkpoint import Checkpointer
from ibpo_jax.trainer.logs import MetricsFileError, RunLog, read_metrics

ROOT = Path(__file__).parents[2]


def _smoke(**overrides):
    return config.load("configs/ibpo_gspo.py:smoke", [(k, str(v)) for k, v in overrides.items()])


def _hold_lock(path):
    """A child process holding `path`'s lock until killed; returns it once the lock is held."""
    code = textwrap.dedent(f"""
        import sys, time
        from ibpo_jax.trainer.workdir import RunLock
        RunLock({str(path)!r}).acquire()
        print("held", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_run_exits_naming_the_holder_and_a_killed_holder_leaves_no_lock(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval_accuracy": 0.5}\n')
    holder = _hold_lock(tmp_path)
    try:
        with pytest.raises(workdir.WorkdirInUse) as e:
            loop.run(_smoke(), workdir=tmp_path)  # refused before anything is built or written
        message = str(e.value)
        assert f"pid {holder.pid} on host {socket.gethostname()}, started 20" in message
        assert str(tmp_path) in message and "\n" not in message
        assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 0, "eval_accuracy": 0.5}\n'
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with workdir.RunLock(tmp_path) as lock:  # the kernel dropped the dead holder's lock
        record = json.loads((tmp_path / workdir.LOCK_FILE).read_text())
        assert (record["pid"], record["host"]) == (os.getpid(), socket.gethostname())
        with pytest.raises(workdir.WorkdirInUse, match=f"pid {os.getpid()} "):
            workdir.RunLock(tmp_path).acquire()  # held even against this same process
    assert lock._fd is None
    workdir.RunLock(tmp_path).acquire().release()  # released on exit


def _fake_checkpoint(path, cfg, step=2, width=4):
    """A checkpoint of `cfg` holding a small state (what loop.run checks before building)."""
    ckpt = Checkpointer(path / "checkpoints", keep=3)
    ckpt.save(step, {"w": jnp.ones((width,))}, {"step": step, "data_position": 0,
                                                "config": cfg.to_dict()})
    ckpt.close()
    return ckpt


def test_changed_config_is_refused_with_old_and_new_values(tmp_path):
    _fake_checkpoint(tmp_path, _smoke())
    (tmp_path / "config.json").write_text(_smoke().to_json())
    changed = _smoke(**{"optim.lr": 1e-3, "model.tiny.hidden_size": 32})
    with pytest.raises(workdir.ConfigChanged) as e:
        loop.run(changed, workdir=tmp_path)
    message = str(e.value)
    old = _smoke()
    assert (f"model.tiny.hidden_size: {old.model.tiny.hidden_size} -> 32, "
            f"optim.lr: {json.dumps(old.optim.lr)} -> 0.001") in message
    assert str(tmp_path / "checkpoints" / "2") in message
    assert "--config.train.allow_config_change=true" in message
    assert json.loads((tmp_path / "config.json").read_text()) == json.loads(_smoke().to_json())
    # Operational keys (where and how the run executes) change freely.
    moved = _smoke(**{"task.data_dir": "/elsewhere", "mesh.data": 2, "train.progress": True})
    workdir.check_config(_smoke().to_dict(), moved, where="x")


def test_allowed_change_is_appended_to_the_history_not_written_over_config_json(tmp_path):
    first, later = _smoke(), _smoke(**{"optim.lr": 1e-3, "train.allow_config_change": True})
    workdir.record_config(tmp_path, first, step=None, changes={})
    changes = workdir.check_config(first.to_dict(), later, where="x")
    lr = first.optim.lr
    assert changes == {"optim.lr": (lr, 1e-3), "train.allow_config_change": (False, True)}
    workdir.record_config(tmp_path, later, step=4, changes=changes)
    workdir.record_config(tmp_path, later, step=6, changes={})  # unchanged since: no row
    assert json.loads((tmp_path / "config.json").read_text())["optim"]["lr"] == lr
    (row,) = [json.loads(line) for line in
              (tmp_path / workdir.HISTORY_FILE).read_text().splitlines()]
    assert row["step"] == 4 and row["config"]["optim.lr"] == 1e-3
    assert row["changes"]["optim.lr"] == {"old": lr, "new": 1e-3}


def test_model_shape_mismatch_names_the_config_key(tmp_path):
    """Allowed to change, the model still cannot: the error names the leaf and the key, not
    orbax's pages of tensorstore specs."""
    ckpt = _fake_checkpoint(tmp_path, _smoke(), width=4)
    later = _smoke(**{"model.tiny.hidden_size": 32, "train.allow_config_change": True})
    ckpt = Checkpointer(tmp_path / "checkpoints")
    with pytest.raises(workdir.ConfigChanged) as e:
        workdir.resume(ckpt, later, {"w": jnp.ones((8,))}, tmp_path, log=print, record=True)
    ckpt.close()
    message = str(e.value)
    assert "w: shape (4,) in the checkpoint, (8,) here" in message
    assert f"model.tiny.hidden_size: {_smoke().model.tiny.hidden_size} -> 32" in message
    assert "\n" not in message
    assert not (tmp_path / workdir.HISTORY_FILE).exists()


def test_torn_last_metrics_line_is_dropped_with_a_warning(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "eval_accuracy": 0.5}, {"step": 1, "reward_mean": 0.25}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 2, "rew')
    with pytest.warns(RuntimeWarning, match=r"metrics\.jsonl:3: dropped a torn last line"):
        assert read_metrics(path) == rows
    with pytest.warns(RuntimeWarning):  # resume from step 1 rewrites the file without it
        RunLog(tmp_path, total_steps=4, last_step=1, progress=False).close()
    assert read_metrics(path) == rows
    path.write_text('{"step": 0}\n{"st\n{"step": 2}\n')  # damage before the end: an error
    with pytest.raises(MetricsFileError, match=r"metrics\.jsonl:2: unreadable metrics row"):
        read_metrics(path)


def test_resume_drops_the_killed_runs_later_rows_from_metrics_and_record_files(tmp_path):
    """A run killed after logging step 3 resumes from its step-2 checkpoint: steps 3+ leave
    metrics.jsonl and appendix_a.jsonl alike, so the rerun's rows are not written twice."""
    log = RunLog(tmp_path, total_steps=4, last_step=-1, progress=False)
    for s in range(4):
        log.write(s, {"reward_mean": 0.1 * s})
        log.record("appendix_a.jsonl", {"step": s, "phi": [0.5, s]})
    log.close()
    RunLog(tmp_path, total_steps=4, last_step=2, progress=False).close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    assert (tmp_path / "appendix_a.jsonl").read_text() == "".join(
        f'{{"step":{s},"phi":[0.5,{s}]}}\n' for s in range(3))  # compact lines kept compact
    with pytest.raises(ValueError, match="record file 'other.jsonl': not one of appendix_a"):
        RunLog(tmp_path, total_steps=4, last_step=2, progress=False).record("other.jsonl", {})


def test_stall_guard_stops_after_k_steps_with_every_update_skipped():
    guard = workdir.StallGuard(updates_per_step=4, limit=3)
    for s, skipped in enumerate([4, 4, 1, 4, 4], start=1):  # a step with an applied update
        guard.check(s, {"updates_skipped_nonfinite": skipped})  # resets the count
    with pytest.raises(workdir.UpdatesStalled, match=r"steps 4-6: all 4 updates of each step"):
        guard.check(6, {"updates_skipped_nonfinite": 4.0})


def _train(tmp_path, *args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "ibpo_jax.train", "--config=configs/ibpo_gspo.py:smoke",
         f"--workdir={tmp_path}", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})})


def test_entry_point_prints_one_line_and_the_traceback_only_when_debugging(tmp_path):
    _fake_checkpoint(tmp_path, _smoke())
    out = _train(tmp_path, "--config.optim.lr=0.001")
    assert out.returncode == 1, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and f"optim.lr: {json.dumps(_smoke().optim.lr)} -> 0.001" in lines[0]
    assert "Traceback" not in out.stderr
    for args, env in ((["--debug"], None), ([], {"IBPO_DEBUG": "1"})):
        out = _train(tmp_path, "--config.optim.lr=0.001", *args, env=env)
        assert out.returncode == 1 and "Traceback" in out.stderr
        assert "ConfigChanged: the config differs" in out.stderr
    holder = _hold_lock(tmp_path)
    try:
        out = _train(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"error: workdir {tmp_path} is in use by another run (pid {holder.pid}" in out.stderr
