"""A run stopped by SIGTERM / SIGINT: it finishes its step, checkpoints it and exits 3 with the
command that resumes it; that command reproduces the uninterrupted run bitwise, without orbax's
warnings; a second signal exits at once; raising train.steps extends a finished run."""

import json
import shlex
import signal
import subprocess
import time

import pytest

from ibpo_jax.data.tokenizer import CharTokenizer
from ibpo_jax.trainer import cli
from ibpo_jax.trainer.logs import read_metrics
from tests.trainer.test_loop import ROOT, _appendix_a, _comparable, _train_cmd


@pytest.fixture(scope="module")
def reference(smoke_data_dir, tmp_path_factory):
    """(workdir, rows) of the uninterrupted 6-step run."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    cmd, env = _train_cmd(workdir, smoke_data_dir, 1)
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, timeout=600)
    return workdir, read_metrics(workdir / "metrics.jsonl")


def _wait_for_row(proc, metrics, step):
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if any(r["step"] >= step for r in read_metrics(metrics)):
            return
        time.sleep(0.05)
    raise AssertionError(f"the run ended (rc {proc.poll()}) before it logged step {step}")


@pytest.fixture(scope="module")
def stopped(reference, smoke_data_dir, tmp_path_factory):
    """A run sent SIGTERM once step 1 is logged, then resumed with the command it printed:
    (workdir, the stopped run's stderr, its step, the resume's stderr)."""
    workdir = tmp_path_factory.mktemp("stopped")
    cmd, env = _train_cmd(workdir, smoke_data_dir, 1)
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _wait_for_row(proc, workdir / "metrics.jsonl", 1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == cli.EXIT_STOPPED, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGTERM after step "), last
    step = int(last.split("after step ")[1].split()[0])
    resume = shlex.split(last.split("; resume with: ")[1])
    assert resume == [*cmd], resume  # the exact command (the workdir was given)
    out = subprocess.run(resume, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return workdir, err, step, out.stderr


def test_sigterm_checkpoints_the_step_and_the_resume_reproduces_the_run(reference, stopped):
    ref_dir, ref_rows = reference
    workdir, err, step, resume_err = stopped
    assert 1 <= step < 6
    assert "SIGTERM: finishing this step" in err and "Traceback" not in err
    rows = read_metrics(workdir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(7))
    assert _comparable(rows) == _comparable(ref_rows)  # bitwise: floats compared exactly
    assert _appendix_a(workdir) == _appendix_a(ref_dir)
    assert "WARNING:absl" not in resume_err, resume_err[-3000:]


def test_the_runs_hf_export_carries_a_tokenizer_transformers_loads(reference):
    """Trainer.export_hf of a char-tokenizer run (tests/trainer/test_export.py: the parts)."""
    transformers = pytest.importorskip("transformers")
    export = reference[0] / "hf_final"
    tok = transformers.AutoTokenizer.from_pretrained(export)
    text = "12+30=42\nAnswer: 42"
    assert tok.encode(text) == CharTokenizer().encode(text)
    model = transformers.AutoModelForCausalLM.from_pretrained(export)
    assert model.generation_config.eos_token_id == tok.eos_token_id == CharTokenizer().eos_id


def test_second_signal_exits_at_once_and_raising_steps_extends_the_run(stopped, smoke_data_dir):
    workdir = stopped[0]
    cmd, env = _train_cmd(workdir, smoke_data_dir, 1, "--config.train.steps=7")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:  # restored: the handlers are in place, step 7 has not run
        if line.startswith("resumed from"):
            break
    proc.send_signal(signal.SIGINT)
    for line in proc.stderr:  # handled (two signals before Python runs would count once)
        if line.startswith("SIGINT: finishing this step"):
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    assert "SIGINT again: exiting now" in err
    assert [r["step"] for r in read_metrics(workdir / "metrics.jsonl")] == list(range(7))

    # train.steps 6 -> 7 under a constant schedule: accepted without allow_config_change.
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r["step"] for r in read_metrics(workdir / "metrics.jsonl")] == list(range(8))
    history = [json.loads(line) for line in (workdir / "config_history.jsonl").open()]
    assert history[-1]["step"] == 6
    assert history[-1]["changes"] == {"train.steps": {"old": 6, "new": 7}}
    assert json.loads((workdir / "config.json").read_text())["train"]["steps"] == 6


@pytest.mark.parametrize("last_step", [-1, 3])
def test_progress_eta_leaves_out_the_first_step_after_a_start_or_resume(tmp_path, last_step):
    """The first step after a start or resume compiles: its time does not enter the ETA's
    rate (with it the rate here would be under 2 steps/s)."""
    from ibpo_jax.trainer.logs import RunLog

    log = RunLog(tmp_path, total_steps=20, last_step=last_step, progress=True,
                 backends=("jsonl",))
    if last_step < 0:
        log.write(0, {"reward_mean": 0.0})  # the base evaluation
    time.sleep(1.0)  # the first RL step's compiles
    first = 1 if last_step < 0 else last_step + 1
    log.write(first, {"reward_mean": 0.0})
    for s in range(first + 1, first + 5):
        time.sleep(0.05)
        log.write(s, {"reward_mean": 0.0})
    meter = log._bar.format_dict
    log.close()
    assert meter["n"] - meter["initial"] == 4
    assert 4 / meter["elapsed"] > 5, meter
