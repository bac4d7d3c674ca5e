"""End-to-end runs of the trainer on the `smoke` preset: every config, exact resume after
SIGKILL, and a (2, 2, 2) mesh of 8 fake CPU devices against one device."""

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ibpo_jax import config
from ibpo_jax.trainer import loop, parts
from ibpo_jax.trainer.logs import read_metrics
from tests.trainer.multiprocess import start_two_processes, train_in_two_processes

ROOT = Path(__file__).parents[2]
CONFIGS = sorted(p.stem for p in (ROOT / "configs").glob("*.py")
                 if p.stem not in ("__init__", "base"))
TIMING = ("time_", "tokens_per_s")
REQUIRED = {
    "step", "reward_mean", "reward_var", "accuracy", "phi_mean", "cov_y_phi", "lambda_max",
    "adv_var", "adv_var_gspo", "kl", "entropy", "clip_frac", "response_len_mean",
    "frac_groups_all_same", "cancellation_residual", "grad_norm", "budget_trajectories",
    "tokens_per_s", "time_rollout_s", "time_reward_s", "time_phi_s", "time_update_s",
}


@pytest.fixture(scope="module")
def data_dir(smoke_data_dir):
    """Shared data + warm-start cache: the smoke base policy is trained once per session."""
    return smoke_data_dir


def _overrides(data_dir, **extra):
    return [("task.data_dir", str(data_dir)), *((k, str(v)) for k, v in extra.items())]


@pytest.mark.parametrize("algo", CONFIGS)
def test_every_config_runs_a_few_steps(algo, data_dir, tmp_path):
    # (SCoRe: one stage-I step, then stage II: a run that never reaches it is refused.)
    score = {"score.stage1_steps": 1} if algo == "score_grpo" else {}
    cfg = config.load(f"configs/{algo}.py:smoke", _overrides(data_dir, **{"train.steps": 2},
                                                             **score))
    rows = loop.run(cfg, workdir=tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "eval_accuracy" in rows[0] and "eval_accuracy" in rows[-1]
    for row in rows[1:]:
        assert REQUIRED <= set(row), REQUIRED - set(row)
        assert all(not isinstance(v, str) for v in row.values()), row  # no NaN / inf
        # 16 sampled per step (SCoRe: 32, both attempts), after the PRM's labelling rollouts.
        per_step = 32 if algo == "score_grpo" else 16
        assert row["budget_trajectories"] == rows[0]["budget_trajectories"] + row["step"] * per_step
    assert (rows[0]["budget_trajectories"] > 0) == (algo == "prm_gspo")
    # The smoke base solves about a third of the problems: groups are mixed, so the credit
    # path runs on real data (a φ of 0 everywhere would make IBPO's checks vacuous).
    assert any(0 < r["accuracy"] < 1 for r in rows[1:])
    if algo.startswith("ibpo_"):
        assert any(r["phi_mean"] > 0 for r in rows[1:])
    else:
        assert all(r["phi_mean"] == 0 for r in rows[1:])
    assert (tmp_path / "summary.md").exists() and (tmp_path / "hf_final" / "config.json").exists()
    assert list((tmp_path / "tensorboard").iterdir())


def _train_cmd(workdir, data_dir, devices, *extra):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "ibpo_jax.train", "--config=configs/ibpo_gspo.py:smoke",
           f"--workdir={workdir}", f"--config.task.data_dir={data_dir}",
           "--config.train.steps=6", "--config.train.checkpoint_every=2",
           "--config.diagnostics.grad_var_every=3", *extra]  # Appendix A's at steps 1, 3, 6
    return cmd, env


def _comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


@pytest.fixture(scope="module")
def uninterrupted_dir(data_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    cmd, env = _train_cmd(workdir, data_dir, 1)
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, timeout=600)
    return workdir


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_dir):
    rows = read_metrics(uninterrupted_dir / "metrics.jsonl")
    assert any(r.get("phi_mean", 0) > 0 for r in rows)  # the runs compared below do learn
    return rows


def test_evaluate_cli_reads_a_run_and_its_hf_export_alike(uninterrupted_dir, data_dir,
                                                          tmp_path):
    """`python -m ibpo_jax.evaluate` on the run's workdir (latest orbax checkpoint, restored
    read-only with the run's stored config) and on its HF export: same policy, same scores."""
    results = []
    for i, ckpt in enumerate([uninterrupted_dir, uninterrupted_dir / "hf_final"]):
        out = tmp_path / f"eval{i}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "ibpo_jax.evaluate", "--config=configs/ibpo_gspo.py:smoke",
             f"--checkpoint={ckpt}", f"--out={out}", f"--config.task.data_dir={data_dir}",
             "--config.eval.num_prompts=16"],
            cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "| ibpo_gspo avg@4 |" in proc.stdout  # the paper's Table 1 layout
        results.append(json.loads(out.read_text()))
    assert list(results[0]) == ["arith/test"]
    assert 0 <= results[0]["arith/test"]["eval_accuracy"] <= 1
    assert results[0] == results[1]


def test_sigkill_and_resume_reproduces_the_run_bitwise(uninterrupted, uninterrupted_dir, data_dir,
                                                      tmp_path):
    cmd, env = _train_cmd(tmp_path, data_dir, 1)
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:  # kill once step 3 is logged
        if any(r["step"] >= 3 for r in read_metrics(metrics)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = max(r["step"] for r in read_metrics(metrics))
    assert 3 <= killed_at < 6
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, timeout=600)
    resumed = read_metrics(metrics)
    assert [r["step"] for r in resumed] == list(range(7))
    assert _comparable(resumed) == _comparable(uninterrupted)  # bitwise: floats compared exactly
    assert _appendix_a(tmp_path) == _appendix_a(uninterrupted_dir)  # step 3's not twice


def _appendix_a(workdir):
    return [json.loads(line) for line in (Path(workdir) / "appendix_a.jsonl").read_text()
            .splitlines()]


def _assert_same_records(workdir, reference_dir):
    """Appendix A's per-row records: discrete fields exactly, φ (5 decimals) to rounding."""
    rows, reference = _appendix_a(workdir), _appendix_a(reference_dir)
    assert [r["step"] for r in rows] == [r["step"] for r in reference] == [1, 3, 6]
    for a, b in zip(rows, reference):
        assert {k: v for k, v in a.items() if k != "phi"} == {
            k: v for k, v in b.items() if k != "phi"}
        np.testing.assert_allclose(a["phi"], b["phi"], atol=2e-5)
    assert any(t >= 0 for r in reference for t in r["true_first_wrong"])  # the checker reports


def _assert_same_run(rows, reference):
    """Tolerance: sharded matmuls reduce in another order (float32 rounding, ~1e-6 relative);
    rewards and accuracies are discrete and must agree exactly."""
    assert [r["step"] for r in rows] == [r["step"] for r in reference]
    for a, b in zip(_comparable(reference), _comparable(rows)):
        assert a.keys() == b.keys()
        for key in a:
            if key in ("reward_mean", "accuracy", "eval_accuracy", "response_len_mean"):
                assert a[key] == b[key], (a["step"], key)
            else:
                assert math.isclose(a[key], b[key], rel_tol=1e-3, abs_tol=1e-4), (
                    a["step"], key, a[key], b[key])


def test_mesh_of_8_devices_matches_one_device(uninterrupted, uninterrupted_dir, data_dir,
                                              tmp_path):
    cmd, env = _train_cmd(tmp_path, data_dir, 8, "--config.mesh.data=2",
                          "--config.mesh.fsdp=2", "--config.mesh.tensor=2")
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, timeout=600)
    _assert_same_run(read_metrics(tmp_path / "metrics.jsonl"), uninterrupted)
    _assert_same_records(tmp_path, uninterrupted_dir)


def test_bad_config_value_stops_at_start_up_naming_the_key():
    out = subprocess.run([sys.executable, "-m", "ibpo_jax.train",
                          "--config=configs/ibpo_gspo.py", "--config.optim.lr=fast"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "config.optim.lr='fast': expected float" in out.stderr
    out = subprocess.run([sys.executable, "-m", "ibpo_jax.train",
                          "--config=configs/ibpo_gspo.py", "--config.optim.lrate=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "valid keys here" in out.stderr


def test_compare_runs_script_summarizes_a_finished_run(uninterrupted_dir, uninterrupted):
    out = subprocess.run([sys.executable, "experiments/compare_runs.py", str(uninterrupted_dir)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout
    row = next(line for line in out.splitlines() if line.startswith("| ibpo_gspo |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    evals = [r["eval_accuracy"] for r in uninterrupted if "eval_accuracy" in r]
    assert cells[2] == f"{100 * evals[0]:.1f}" and cells[3] == f"{100 * evals[-1]:.1f}"


def test_a_run_writes_eval_samples_grouped_tags_and_a_plot(uninterrupted_dir, uninterrupted,
                                                           tmp_path):
    """What people read of a run: config.logging.samples evaluation samples per evaluation in
    samples.jsonl, TensorBoard scalars under the five groups, `python -m ibpo_jax.trainer.plot`."""
    from tests.trainer.test_logs import GROUPS, read_events

    cfg = json.loads((uninterrupted_dir / "config.json").read_text())
    n = min(cfg["logging"]["samples"], cfg["eval"]["num_prompts"])
    samples = read_metrics(uninterrupted_dir / "samples.jsonl")
    evals = [r["step"] for r in uninterrupted if "eval_accuracy" in r]
    assert n > 0 and [r["step"] for r in samples] == [s for s in evals for _ in range(n)]
    assert {r["benchmark"] for r in samples} == {cfg["task"]["name"]}
    assert all(r["prompt"] and isinstance(r["response"], str) for r in samples)
    right, wrong = ([r["reward"] for r in samples if r["correct"] is c] for c in (True, False))
    assert min(right, default=1e9) > max(wrong, default=-1e9)  # the verdicts match the rewards
    assert not any("first_wrong_step" in r for r in samples if r["correct"])
    events = read_events(uninterrupted_dir)
    tags = {t for t, _, kind in events if kind == "simple_value"}
    assert {t.split("/")[0] for t in tags} == set(GROUPS)
    assert {"eval/eval_accuracy", "train/reward_mean", "credit/phi_mean"} <= tags
    assert any(t.startswith("samples/") for t, _, kind in events if kind == "tensor")
    out = tmp_path / "curves.png"
    subprocess.run([sys.executable, "-m", "ibpo_jax.trainer.plot", str(uninterrupted_dir), "--out",
                    str(out)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    assert out.read_bytes().startswith(b"\x89PNG")


def _wait_for_step(metrics, step, *, since=0.0, timeout=600):
    """Until metrics.jsonl, written after `since`, logs a row of `step` or later."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (metrics.exists() and metrics.stat().st_mtime > since
                and any(r["step"] >= step for r in read_metrics(metrics))):
            return
        time.sleep(0.05)
    raise AssertionError(f"no step {step} logged in {timeout} s")


def test_two_processes_lost_one_stopped_on_one_resume_and_match_one_device(
        uninterrupted, uninterrupted_dir, data_dir, tmp_path):
    """Multi-host on one machine: two processes (jax.distributed, 2 CPU devices each, a data
    mesh over all 4) each score only the rows their devices hold and a share of the eval rows,
    write one run together (metrics from process 0, checkpoints from both) and match the
    one-device run, through issue 60's two faults:
    - a lost host: process 1 killed (SIGKILL to its watchman, its trainer with it) after
      step 3; process 0 ends within train.heartbeat_s with one line naming process 1, the last
      checkpoint and the resume command, exit 4, no C++ stack on the terminal (it is in the
      runtime's log), no temporary checkpoint left;
    - preemption of one host of several: SIGTERM to process 1 alone; both finish the step,
      one checkpoint is written, both exit 3 naming it;
    and the rerun of both resumes each time."""
    cmd, _ = _train_cmd(tmp_path, data_dir, 2, "--config.mesh.data=-1",
                        "--config.train.heartbeat_s=10")
    args, metrics = cmd[3:], tmp_path / "metrics.jsonl"  # after `python -m ibpo_jax.train`
    procs = start_two_processes(args)
    _wait_for_step(metrics, 3)
    procs[1].kill()
    killed = time.time()
    out = procs[0].communicate(timeout=300)[0]
    assert procs[0].returncode == 4 and time.time() - killed < 10 + 30, out[-2000:]
    lost = [x for x in out.splitlines() if x.startswith("error:")]
    assert len(lost) == 1 and lost[0].startswith("error: lost process 1 of 2: no heartbeat "
                                                 "within train.heartbeat_s=10 s"), out[-2000:]
    assert f"last complete checkpoint {tmp_path / 'checkpoints'}/2;" in lost[0]
    resume = shlex.join([*cmd, "--config.train.distributed=true"])
    assert f"resume with: {resume} (every process)" in lost[0]
    assert "stack trace" not in out and "@ 0x" not in out and "[Gloo]" not in out
    assert "stopped sending heartbeats" in (tmp_path / "runtime_0.log").read_text()
    assert not list((tmp_path / "checkpoints").glob("*tmp*"))

    rerun = time.time()
    procs = start_two_processes(args)
    _wait_for_step(metrics, 3, since=rerun)
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [3, 3], outs[0][-2000:] + outs[1][-2000:]
    assert f"resumed from {tmp_path / 'checkpoints'}/2" in outs[0]
    stopped = [next(x for x in out.splitlines() if x.startswith("stopped by SIGTERM after"))
               for out in outs]
    assert stopped[0].split(";")[0] == stopped[1].split(";")[0]  # the same step, one checkpoint
    step = int(stopped[0].split("after step ")[1].split()[0])
    assert 3 <= step < 6 and (tmp_path / "checkpoints" / str(step)).is_dir()
    assert not list((tmp_path / "checkpoints").glob("*tmp*"))
    train_in_two_processes(args)
    _assert_same_run(read_metrics(metrics), uninterrupted)
    _assert_same_records(tmp_path, uninterrupted_dir)  # the checker's reports of both
    assert (tmp_path / "hf_final" / "config.json").exists()


def test_damaged_latest_checkpoint_and_torn_metrics_line_resume_the_same_run(
        uninterrupted_dir, uninterrupted, data_dir, tmp_path):
    """A finished run's last checkpoint cut short and its metrics' last line torn: rerunning
    skips the damaged step 6 (naming it), resumes from step 4 and ends with the same rows."""
    import shutil

    workdir = tmp_path / "run"
    shutil.copytree(uninterrupted_dir, workdir)
    data = max((p for p in (workdir / "checkpoints" / "6" / "state").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    metrics = workdir / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 7, "reward_me')
    cmd, env = _train_cmd(workdir, data_dir, 1)
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"skipping damaged checkpoint {workdir / 'checkpoints' / '6'} (" in out.stdout
    assert "dropped a torn last line" in out.stderr
    assert f"resumed from {workdir / 'checkpoints'}/4" in out.stdout
    assert _comparable(read_metrics(metrics)) == _comparable(uninterrupted)
    assert _appendix_a(workdir) == _appendix_a(uninterrupted_dir)


def test_changed_config_resumes_only_when_allowed_and_is_recorded(uninterrupted_dir, data_dir,
                                                                  tmp_path):
    import shutil

    workdir = tmp_path / "run"
    shutil.copytree(uninterrupted_dir, workdir)
    original = (workdir / "config.json").read_text()
    # train.steps extends the run (accepted: tests/trainer/test_signals.py); optim.lr does not.
    cmd, env = _train_cmd(workdir, data_dir, 1, "--config.train.steps=7",
                          "--config.optim.lr=1.23e-05")
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "error: the config differs" in out.stderr and "-> 1.23e-05)" in out.stderr
    assert "train.steps" not in out.stderr
    out = subprocess.run([*cmd, "--config.train.allow_config_change=true"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r["step"] for r in read_metrics(workdir / "metrics.jsonl")] == list(range(8))
    assert (workdir / "config.json").read_text() == original
    (row,) = [json.loads(line) for line in (workdir / "config_history.jsonl").open()]
    assert row["step"] == 6 and row["changes"]["train.steps"] == {"old": 6, "new": 7}
    assert row["changes"]["optim.lr"]["new"] == 1.23e-05
    assert row["changes"]["train.allow_config_change"] == {"old": False, "new": True}


def test_stalled_updates_stop_the_run_before_the_export(data_dir, tmp_path, monkeypatch):
    """Updates made non-finite (a NaN scale after AdamW): the step skips them, and after
    workdir.MAX_STALLED_STEPS such steps in a row the run stops instead of exporting."""
    import optax

    from ibpo_jax.trainer import workdir

    make = parts.make_optimizer
    monkeypatch.setattr(parts, "make_optimizer", lambda optim, **kw: optax.chain(
        make(optim, **kw), optax.scale(float("nan"))))
    cfg = config.load("configs/ibpo_gspo.py:smoke", _overrides(data_dir, **{"train.steps": 8}))
    with pytest.raises(workdir.UpdatesStalled, match="updates of each step were skipped"):
        loop.run(cfg, workdir=tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    per_step = cfg.optim.epochs * cfg.optim.minibatches
    stalled = rows[-workdir.MAX_STALLED_STEPS:]
    assert all(r["updates_skipped_nonfinite"] == per_step for r in stalled)
    assert rows[-1]["step"] < 8 and not (tmp_path / "hf_final").exists()
    with workdir.RunLock(tmp_path):  # the failed run released its workdir
        pass


def test_evaluate_cli_prints_one_line_naming_the_checkpoint(uninterrupted_dir, data_dir,
                                                            tmp_path):
    """No readable checkpoint in a workdir: one line naming it (the traceback with --debug)."""
    import shutil

    workdir = tmp_path / "run"
    shutil.copytree(uninterrupted_dir, workdir)
    for record in (workdir / "checkpoints").glob("*/meta/metadata"):
        record.unlink()
    cmd = [sys.executable, "-m", "ibpo_jax.evaluate", "--config=configs/ibpo_gspo.py:smoke",
           f"--checkpoint={workdir}", f"--config.task.data_dir={data_dir}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"error: --checkpoint {workdir}: no readable checkpoint in {workdir / 'checkpoints'}" \
        in out.stderr
    out = subprocess.run([*cmd, "--debug"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 1 and "Traceback" in out.stderr


def test_budget_stops_the_run_with_an_evaluation_and_a_checkpoint(data_dir, tmp_path):
    # 4 prompts x G 4 = 16 trajectories per step: a budget of 20 is reached at step 2 of 4.
    cfg = config.load("configs/gspo.py:smoke", _overrides(
        data_dir, **{"train.steps": 4, "train.budget": 20, "train.eval_every": 4}))
    rows = loop.run(cfg, workdir=tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[-1]["budget_trajectories"] == 32 and "eval_accuracy" in rows[-1]
    assert rows[-1]["time_total_s"] > rows[1]["time_total_s"] > 0
    assert (tmp_path / "checkpoints" / "2").exists()


def test_a_save_that_cannot_be_written_stops_in_one_line_and_the_rerun_completes(
        uninterrupted, data_dir, tmp_path):
    """Issue 60's disk fault in a size-limited process (RLIMIT_FSIZE: its checkpoint's data
    file is larger than any file may be): one line naming the step, the directory, the bytes
    and the resume point, no traceback, no temporary directory left; the rerun (no limit)
    completes with the uninterrupted run's metrics."""
    import resource

    cmd, env = _train_cmd(tmp_path, data_dir, 1)
    limit = 200_000  # bytes: logs and records fit, the checkpoint's ~0.9 MB data file does not
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                               (limit, limit)))
    assert out.returncode == 1
    assert "Traceback" not in out.stdout + out.stderr, out.stderr[-2000:]
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: checkpoint of step 2 failed (a file over the process's "
                           "size limit, ulimit -f): it needs ")
    assert f"in {tmp_path / 'checkpoints'}, " in line and "so it starts over" in line
    assert not list((tmp_path / "checkpoints").glob("*tmp*"))
    assert (tmp_path / "checkpoint_errors.log").stat().st_size > 0  # orbax's own account
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, timeout=600)
    assert _comparable(read_metrics(tmp_path / "metrics.jsonl")) == _comparable(uninterrupted)
