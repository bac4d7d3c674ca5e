"""Code reward: run a program against stdin/stdout and LiveCodeBench call-based tests, sandboxed.

`run_tests` gives every program a fresh subprocess (`_harness.py`) in a new session (its own
process group) and a fresh temporary directory, with an empty environment (no inherited
secrets), rlimits on memory, CPU time, output size (stdout/stderr are capped files), open files
and processes, Landlock confinement where the kernel has it, and an audit hook in the process
that runs the program (see the harness docstring for the layers). The program may read files
but not write any: its only outputs are stdout and stderr (and the call-based return value).
The whole group is killed with SIGKILL when the sandbox finishes or overruns its deadline, and
the directory removed.
Every failure mode comes back as a failed CodeResult with a reason; nothing is raised to the
caller for anything the program does.

Verdicts follow LiveCodeBench: stdio outputs are compared line by line after stripping, a line
that differs as text may still match token-wise as decimals ("1.0" == "1"); call-based tests
call Solution().<fn_name>(*args) (or a top-level function fn_name) with one JSON argument per
input line and compare the JSON result (tuples as lists) with the expected JSON value.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

from ibpo_jax.data.formats import decode_lcb_tests
from ibpo_jax.registry import REWARDS

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_harness.py")
STARTUP_SLACK_S = 5.0  # interpreter start-up and harness set-up, beyond the per-test limits
_CODE_BLOCK_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.I)


@dataclasses.dataclass(frozen=True)
class CodeResult:
    """passed: every test passed. reason: "passed" or what went wrong first (test index, kind).
    tests: per executed test {status, exit_code, signal, time_s, cpu_s, verdict}.
    isolation: the sandbox layers that were active."""

    passed: bool
    num_passed: int
    num_tests: int
    reason: str
    tests: tuple[dict, ...] = ()
    isolation: tuple[str, ...] = ()


def extract_code(response: str) -> str | None:
    """The last ```python (or bare ```) fenced block of a response, or None."""
    blocks = _CODE_BLOCK_RE.findall(response)
    return blocks[-1] if blocks else None


def _decimals(line: str) -> list[decimal.Decimal] | None:
    try:
        return [decimal.Decimal(tok) for tok in line.split()]
    except decimal.InvalidOperation:
        return None


def stdio_equal(output: str, expected: str) -> bool:
    """LiveCodeBench's stdio comparison (see module docstring)."""
    got = [line.strip() for line in output.strip().split("\n")]
    want = [line.strip() for line in expected.strip().split("\n")]
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if g != w:
            gd, wd = _decimals(g), _decimals(w)
            if gd is None or wd is None or gd != wd:
                return False
    return True


def call_equal(result_json: str, expected_json: str) -> bool:
    try:
        return json.loads(result_json) == json.loads(expected_json)
    except json.JSONDecodeError:
        return False


def _tail(path: str, limit: int = 400) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - limit))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _read(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


def _failure_reason(k: int, status: dict, workdir: str, max_output_bytes: int,
                    timeout_s: float) -> str:
    out, err = os.path.join(workdir, f"out_{k}.txt"), os.path.join(workdir, f"err_{k}.txt")
    err_tail = _tail(err)
    last = err_tail.splitlines()[-1] if err_tail else ""
    if status["status"] == "timeout":
        return f"test {k}: time limit exceeded ({timeout_s:g} s)"
    if (os.path.exists(out) and os.path.getsize(out) >= max_output_bytes) or "EFBIG" in err_tail \
            or "File too large" in err_tail:
        return f"test {k}: output limit exceeded ({max_output_bytes} bytes)"
    if "MemoryError" in last:
        return f"test {k}: memory limit exceeded ({last})"
    if status["signal"]:
        return f"test {k}: killed by {status['signal']}"
    return f"test {k}: runtime error (exit code {status['exit_code']}): {last}"


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Waits for `pid` to exit without reaping it (its pid, hence its process group id, stays
    reserved for killpg); False if `deadline` (monotonic) passed first."""
    delay = 0.0005
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(2 * delay, 0.02)
    return True


def run_tests(program: str, tests: Sequence[Mapping[str, str]], *, timeout_s: float = 6.0,
              memory_mb: int = 1024, fn_name: str | None = None,
              max_output_bytes: int = 32 << 20, max_processes: int = 16) -> CodeResult:
    """Runs `program` (Python 3 source) on `tests` in the sandbox; stops at the first failure.

    tests: [{"input": str, "output": str, "kind": "stdio" | "call"}]; call tests need fn_name.
    timeout_s: wall-clock limit per test (CPU time is capped at the next whole second + 1).
    memory_mb: address-space limit. max_output_bytes: cap on each test's stdout and stderr.
    max_processes: processes/threads the sandbox may add (not enforced by the kernel for root).
    """
    if not tests:
        raise ValueError("run_tests: no tests given; a program cannot pass an empty test set")
    for k, t in enumerate(tests):
        if t.get("kind", "stdio") not in ("stdio", "call"):
            raise ValueError(f"run_tests: test {k} has kind {t.get('kind')!r}")
        if t.get("kind") == "call" and not fn_name:
            raise ValueError(f"run_tests: test {k} is call-based but no fn_name was given")
    if memory_mb < 64:
        raise ValueError(f"run_tests: memory_mb={memory_mb} is too small for a Python process")
    workdir = tempfile.mkdtemp(prefix="ibpo-sandbox-")
    try:
        with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8") as f:
            f.write(program)
        for k, t in enumerate(tests):
            with open(os.path.join(workdir, f"in_{k}.txt"), "w", encoding="utf-8") as f:
                f.write(t["input"])
        config = {"tests": [{"kind": t.get("kind", "stdio"), "input": f"in_{k}.txt"}
                            for k, t in enumerate(tests)],
                  "fn_name": fn_name, "timeout_s": float(timeout_s),
                  "memory_bytes": int(memory_mb) << 20, "max_output_bytes": int(max_output_bytes),
                  "max_processes": int(max_processes), "parent_pid": os.getpid()}
        with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
        shutil.copy(HARNESS, os.path.join(workdir, "harness.py"))
        return _run_harness(workdir, tests, config)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_harness(workdir: str, tests: Sequence[Mapping[str, str]], config: dict) -> CodeResult:
    timeout_s, n = config["timeout_s"], len(tests)
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
    with open(os.path.join(workdir, "harness.log"), "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "harness.py", "config.json"], cwd=workdir, env=env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + STARTUP_SLACK_S + n * (timeout_s + 0.5)
        finished = _wait_unreaped(proc.pid, deadline)
    finally:
        try:  # the whole group: the harness and anything the program left behind
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    if not finished:
        return CodeResult(False, 0, n, f"sandbox exceeded its overall deadline "
                                       f"({STARTUP_SLACK_S + n * (timeout_s + 0.5):g} s)")
    try:
        with open(os.path.join(workdir, "status.json"), encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, json.JSONDecodeError):
        return CodeResult(False, 0, n, f"sandbox failed (exit code {proc.returncode}): "
                                       f"{_tail(os.path.join(workdir, 'harness.log'))}")
    isolation = tuple(report["isolation"])
    if report["compile_error"]:
        return CodeResult(False, 0, n, f"compile error: {report['compile_error']}",
                          isolation=isolation)
    results, cap = [], config["max_output_bytes"]
    for k, status in enumerate(report["tests"]):
        test = tests[k]
        if status["status"] != "ok":
            reason = _failure_reason(k, status, workdir, cap, timeout_s)
        else:
            kind = test.get("kind", "stdio")
            produced = _read(os.path.join(workdir, f"{'res' if kind == 'call' else 'out'}_{k}.txt"),
                             cap)
            equal = (call_equal if kind == "call" else stdio_equal)(produced, test["output"])
            if equal:
                results.append({**status, "verdict": "passed"})
                continue
            reason = (f"test {k}: wrong answer (expected {test['output'][:60]!r}, "
                      f"got {produced[:60]!r})")
        results.append({**status, "verdict": reason})
        return CodeResult(False, k, n, reason, tuple(results), isolation)
    if len(results) < n:  # cannot happen unless status.json was tampered with
        return CodeResult(False, len(results), n, "sandbox reported fewer tests than it was given",
                          tuple(results), isolation)
    return CodeResult(True, n, n, "passed", tuple(results), isolation)


@REWARDS.register("code")
def code_reward(record: dict, response: str, *, timeout_s: float = 6.0,
                memory_mb: int = 1024) -> tuple[bool, dict]:
    """Verifier for code tasks: the response's last ```python block must pass every test of
    the record (public, then private ones, decoded here). The record's own time and memory
    limits apply when they are more generous than timeout_s / memory_mb."""
    program = extract_code(response)
    if program is None:
        return False, {"reason": "no ```python code block in the response", "answer": None}
    tests = list(record["tests"])
    if record.get("private_tests_encoded"):
        tests += decode_lcb_tests(record["private_tests_encoded"])
    result = run_tests(program, tests, fn_name=record.get("fn_name"),
                       timeout_s=max(timeout_s, record.get("time_limit_s") or 0),
                       memory_mb=int(max(memory_mb, record.get("memory_limit_mb") or 0)))
    return result.passed, {"reason": result.reason, "answer": program,
                           "num_passed": result.num_passed, "num_tests": result.num_tests}
