"""cli.entry_point: a user's mistake ends an entry point with one line and a non-zero exit code
(2 for the config, 1 for the rest), the traceback only with --debug / IBPO_DEBUG; a bug keeps
its traceback. Then the real entry points on the mistakes that used to print tracebacks."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ibpo_jax import config
from ibpo_jax.config import registry
from ibpo_jax.data.files import DataFormatError
from ibpo_jax.models import config as model_config
from ibpo_jax.runtime import sharding
from ibpo_jax.trainer import cli
from ibpo_jax.trainer.workdir import WorkdirInUse

ROOT = Path(__file__).parents[2]


def _raising(error):
    @cli.entry_point
    def main(argv):
        raise error

    return main


@pytest.mark.parametrize("error, code, prefix", [
    (config.ConfigError("config.optim.lr=inf: must be finite"), 2, "config error: "),
    (model_config.ArchitectureError("Qwen3Config.head_dim=3 must be even"), 2, "config error: "),
    (registry.UnknownNameError("unknown task 'x' (config key config.task.name); valid: a"), 2,
     "config error: "),
    (registry.UnknownSplitError("task 'arith' has no split 'nope'"), 2, "config error: "),
    (sharding.MeshError("config.mesh.fsdp=8 does not divide 1 device(s)"), 2, "config error: "),
    (WorkdirInUse("workdir w is in use"), 1, "error: "),
    (DataFormatError("data.jsonl:3: malformed JSON"), 1, "error: "),
    (FileNotFoundError("--checkpoint x: nothing there"), 1, "error: "),
    (sharding.DistributedSetupError("jax.distributed.initialize() failed\nsecond line"), 1,
     "error: "),
])
def test_user_errors_print_one_line_and_exit_non_zero(error, code, prefix, capsys, monkeypatch):
    monkeypatch.delenv("IBPO_DEBUG", raising=False)
    assert _raising(error)([]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(prefix) and "Traceback" not in err
    assert " ".join(str(error).split()) in err


def test_debug_re_raises_and_bugs_keep_their_traceback(monkeypatch):
    monkeypatch.delenv("IBPO_DEBUG", raising=False)
    with pytest.raises(config.ConfigError):
        _raising(config.ConfigError("x"))(["--debug"])
    monkeypatch.setenv("IBPO_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        _raising(FileNotFoundError("x"))([])
    monkeypatch.setenv("IBPO_DEBUG", "0")
    with pytest.raises(KeyError):  # a plain KeyError is a bug, not an unknown config name
        _raising(KeyError("x"))([])
    with pytest.raises(ValueError):
        _raising(ValueError("x"))([])


def test_argv_defaults_to_the_command_line(monkeypatch):
    seen = []
    main = cli.entry_point(lambda argv: seen.append(argv) or 0)
    monkeypatch.setattr(sys, "argv", ["prog", "--a", "b"])
    assert main() == 0 and seen == [["--a", "b"]]


def _run(module, *args, env=None):
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "",
                          **(env or {})})


def _one_line(out, code, text):
    assert out.returncode == code, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = [x for x in out.stderr.splitlines() if x.startswith(("error: ", "config error: "))]
    assert len(lines) == 1 and text in lines[0], out.stderr[-2000:]


@pytest.mark.parametrize("module, where", [("ibpo_jax.train", "--workdir"),
                                           ("ibpo_jax.evaluate", "--checkpoint")])
def test_unknown_name_is_one_line(module, where, tmp_path):
    out = _run(module, "--config=configs/ibpo_gspo.py:smoke", f"{where}={tmp_path}",
               "--config.loss.name=nope")
    _one_line(out, 2, "unknown policy loss 'nope' (config key config.loss.name); valid: ")


def test_mesh_that_does_not_fit_names_the_keys_and_the_fix(tmp_path):
    out = _run("ibpo_jax.train", "--config=configs/ibpo_gspo.py:smoke", f"--workdir={tmp_path}",
               "--config.mesh.data=1", "--config.mesh.fsdp=2")
    _one_line(out, 2, "config.mesh.data=1 x config.mesh.fsdp=2 x config.mesh.tensor=1 = 2 "
              "device(s), but there are 1; set config.mesh.fsdp=-1")


def test_unknown_split_is_one_line(smoke_data_dir, tmp_path):
    out = _run("ibpo_jax.train", "--config=configs/ibpo_gspo.py:smoke", f"--workdir={tmp_path}",
               f"--config.task.data_dir={smoke_data_dir}", "--config.warm_start.enabled=false",
               "--config.task.train_split=nope")
    _one_line(out, 2, "task 'arith' has no split 'nope'; available: ")


def test_a_launch_jax_cannot_join_is_one_line(tmp_path):
    """Open MPI said 2 processes, but gave jax no coordinator it can find."""
    out = _run("ibpo_jax.train", "--config=configs/ibpo_gspo.py:smoke", f"--workdir={tmp_path}",
               env={"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"})
    _one_line(out, 1, "jax.distributed.initialize() failed for the multi-process launch "
              "(OMPI_COMM_WORLD_SIZE=2)")
