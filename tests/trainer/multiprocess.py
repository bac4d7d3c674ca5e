"""Multi-host on one machine for the tests: the trainer in two processes (jax.distributed,
`devices` CPU devices each, gloo collectives), writing one run together."""

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def train_in_two_processes(args: list[str], devices: int = 2, timeout: int = 900) -> None:
    """`python -m ibpo_jax.train ARGS --config.train.distributed=true` as processes 0 and 1;
    fails with the tail of a process's output when either exits non-zero."""
    with socket.socket() as s:  # a free port for the coordinator
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for i in range(2):
        env = {**os.environ, "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
               "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2",
               "JAX_PROCESS_ID": str(i)}
        cmd = [sys.executable, "-m", "ibpo_jax.train", *args, "--config.train.distributed=true"]
        procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        assert p.returncode == 0, out[-3000:]
