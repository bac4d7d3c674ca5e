"""Multi-host on one machine for the tests: the trainer in two processes (jax.distributed,
`devices` CPU devices each, gloo collectives), writing one run together."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def start_two_processes(args: list[str], devices: int = 2) -> list[subprocess.Popen]:
    """`python -m ibpo_jax.train ARGS --config.train.distributed=true` as processes 0 and 1,
    started (their output piped, text)."""
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
    return procs


def train_in_two_processes(args: list[str], devices: int = 2, timeout: int = 900) -> None:
    """Both processes to the end (`start_two_processes`); fails with the tail of a process's
    output when either exits non-zero."""
    for p in start_two_processes(args, devices):
        out, _ = p.communicate(timeout=timeout)
        assert p.returncode == 0, out[-3000:]


def script_in_two_processes(script: str, timeout: int = 300) -> list[dict]:
    """`python -c SCRIPT` as processes 0 and 1 (one CPU device each); each prints one line
    "RESULT <json>". Returns the two parsed results, process 0's first; fails with the tail of
    a process's output when either exits non-zero, or when one hangs in a collective."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for i in range(2):
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "",
               "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2",
               "JAX_PROCESS_ID": str(i)}
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("a process is still waiting in a collective") from None
        assert p.returncode == 0, out[-3000:]
        line = next(x for x in out.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT "):]))
    return results
