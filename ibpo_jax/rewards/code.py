"""Code reward: run a program against stdin/stdout and LiveCodeBench call-based tests, sandboxed.

`run_tests` gives every program a fresh temporary directory and a harness process
(`_harness.py`, kernel layers in `_layers.py`) started in a new session with an empty
environment. The boundary is what the kernel enforces, in layers (see the harness docstring):
a PID namespace whose init is killed at the end (no process survives scoring), no network (a
network namespace, and seccomp denying socket(2) of every family), Landlock (reads only below
the interpreter's directories, no writes, no TCP, signals and abstract sockets scoped), an
unprivileged uid (65534 for a root trainer) so RLIMIT_NPROC binds, and rlimits (CPU, memory,
output size, open files, processes). The audit hook in the program's interpreter stays only as
a fast early "no". The program's only outputs are stdout and stderr (and the call-based return
value); the directory is removed afterwards.

`sandbox="strict"` (config.reward.sandbox, the default) refuses to run code when this host lacks
a layer of REQUIRED (SandboxUnavailable, naming the layer and why); `"best_effort"` runs with
the layers the host has. `sandbox_report()` says which those are.
Every failure of the program comes back as a failed CodeResult with a reason; nothing is raised
to the caller for anything the program does.

Verdicts follow LiveCodeBench: stdio outputs are compared line by line after stripping, a line
that differs as text may still match token-wise as decimals ("1.0" == "1"); call-based tests
call Solution().<fn_name>(*args) (or a top-level function fn_name) with one JSON argument per
input line and compare the JSON result (tuples as lists) with the expected JSON value.
"""

from __future__ import annotations

import dataclasses
import decimal
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence

from ibpo_jax.config.registry import REWARDS
from ibpo_jax.data.formats import decode_lcb_tests

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_harness.py")
LAYERS_FILE = os.path.join(os.path.dirname(HARNESS), "_layers.py")
LAYERS = ("pid_namespace", "net_namespace", "unprivileged_uid", "landlock", "seccomp",
          "audit_hook")  # the layers run_tests can switch (all by default)
REQUIRED = LAYERS + ("rlimits",)  # what sandbox="strict" refuses to run without
SANDBOX_MODES = ("strict", "best_effort")
STARTUP_SLACK_S = 5.0  # interpreter start-up and harness set-up, beyond the per-test limits
_CODE_BLOCK_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.I)


@dataclasses.dataclass(frozen=True)
class CodeResult:
    """passed: every test passed. reason: "passed" or what went wrong first (test index, kind).
    tests: per executed test {status, exit_code, signal, time_s, cpu_s, verdict}.
    isolation: the sandbox layers that were active; missing: "layer: why" for the others;
    landlock_abi: the Landlock ABI applied (0: none)."""

    passed: bool
    num_passed: int
    num_tests: int
    reason: str
    tests: tuple[dict, ...] = ()
    isolation: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    landlock_abi: int = 0


class SandboxUnavailable(RuntimeError):
    """sandbox="strict" and a required layer is missing: no code was run."""


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


def sandbox_mode(sandbox: str) -> str:
    if sandbox not in SANDBOX_MODES:
        raise ValueError(f"config.reward.sandbox must be one of {SANDBOX_MODES}, got {sandbox!r}")
    return sandbox


def _enabled_layers(layers: Collection[str] | None) -> list[str]:
    if layers is None:
        return list(LAYERS)
    unknown = sorted(set(layers) - set(LAYERS))
    if unknown:
        raise ValueError(f"run_tests: unknown sandbox layers {unknown}; known: {LAYERS}")
    return [name for name in LAYERS if name in layers]


def _check_tests(tests: Sequence[Mapping[str, str]], fn_name: str | None, memory_mb: int):
    if not tests:
        raise ValueError("run_tests: no tests given; a program cannot pass an empty test set")
    for k, t in enumerate(tests):
        if t.get("kind", "stdio") not in ("stdio", "call"):
            raise ValueError(f"run_tests: test {k} has kind {t.get('kind')!r}")
        if t.get("kind") == "call" and not fn_name:
            raise ValueError(f"run_tests: test {k} is call-based but no fn_name was given")
    if memory_mb < 64:
        raise ValueError(f"run_tests: memory_mb={memory_mb} is too small for a Python process")


def run_tests(program: str, tests: Sequence[Mapping[str, str]], *, timeout_s: float = 6.0,
              memory_mb: int = 1024, fn_name: str | None = None,
              max_output_bytes: int = 32 << 20, max_processes: int = 16,
              sandbox: str = "strict", layers: Collection[str] | None = None) -> CodeResult:
    """Runs `program` (Python 3 source) on `tests` in the sandbox; stops at the first failure.

    tests: [{"input": str, "output": str, "kind": "stdio" | "call"}]; call tests need fn_name.
    timeout_s: wall-clock limit per test (CPU time is capped at the next whole second + 1).
    memory_mb: address-space limit. max_output_bytes: cap on each test's stdout and stderr.
    max_processes: processes/threads the program may add (RLIMIT_NPROC; binds unless the
    sandbox runs as root, see the unprivileged_uid layer).
    sandbox: "strict" raises SandboxUnavailable, running nothing, when a REQUIRED layer is
    missing; "best_effort" runs with what the host has. layers: the LAYERS to apply (default
    all; fewer is for tests of one layer at a time).
    """
    _check_tests(tests, fn_name, memory_mb)
    enabled = _enabled_layers(layers)
    if sandbox_mode(sandbox) == "strict":
        require_sandbox("strict")  # the host's layers, probed once per process
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
                  "max_processes": int(max_processes), "layers": enabled,
                  "required": list(REQUIRED) if sandbox == "strict" else []}
        with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
        shutil.copy(HARNESS, os.path.join(workdir, "harness.py"))
        shutil.copy(LAYERS_FILE, os.path.join(workdir, "_layers.py"))
        return _run_harness(workdir, tests, config)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _start_harness(workdir: str) -> tuple[subprocess.Popen, int]:
    """The harness process, and the write end of its lifeline (close it once it is done)."""
    alive_r, alive_w = os.pipe()
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
    try:
        with open(os.path.join(workdir, "harness.log"), "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "harness.py", "config.json", str(alive_r)],
                cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, pass_fds=(alive_r,))
    except BaseException:
        os.close(alive_w)
        raise
    finally:
        os.close(alive_r)
    return proc, alive_w


def _run_harness(workdir: str, tests: Sequence[Mapping[str, str]], config: dict) -> CodeResult:
    timeout_s, n = config["timeout_s"], len(tests)
    proc, alive_w = _start_harness(workdir)
    try:
        deadline = time.monotonic() + STARTUP_SLACK_S + n * (timeout_s + 0.5)
        finished = _wait_unreaped(proc.pid, deadline)
    finally:
        try:  # the whole group: the harness and anything the program left behind
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        os.close(alive_w)
    if not finished:
        return CodeResult(False, 0, n, f"sandbox exceeded its overall deadline "
                                       f"({STARTUP_SLACK_S + n * (timeout_s + 0.5):g} s)")
    try:
        with open(os.path.join(workdir, "status.json"), encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, json.JSONDecodeError):
        return CodeResult(False, 0, n, f"sandbox failed (exit code {proc.returncode}): "
                                       f"{_tail(os.path.join(workdir, 'harness.log'))}")
    if report["refused"]:
        raise SandboxUnavailable(_refusal(report["refused"], report["layers"]))
    return _verdicts(report, workdir, tests, config)


def _verdicts(report: dict, workdir: str, tests: Sequence[Mapping[str, str]],
              config: dict) -> CodeResult:
    n, cap = len(tests), config["max_output_bytes"]
    layers = {"isolation": tuple(k for k, v in report["layers"].items() if v is None),
              "missing": tuple(f"{k}: {v}" for k, v in report["layers"].items() if v is not None),
              "landlock_abi": report["landlock_abi"]}
    if report["compile_error"]:
        return CodeResult(False, 0, n, f"compile error: {report['compile_error']}", **layers)
    results = []
    for k, status in enumerate(report["tests"]):
        test = tests[k]
        if status["status"] != "ok":
            reason = _failure_reason(k, status, workdir, cap, config["timeout_s"])
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
        return CodeResult(False, k, n, reason, tuple(results), **layers)
    if len(results) < n:  # cannot happen unless status.json was tampered with
        return CodeResult(False, len(results), n, "sandbox reported fewer tests than it was given",
                          tuple(results), **layers)
    return CodeResult(True, n, n, "passed", tuple(results), **layers)


def _refusal(missing: Mapping[str, str], layers: Mapping[str, str | None]) -> str:
    active = ", ".join(k for k, v in layers.items() if v is None) or "none"
    lacking = "; ".join(f"{k} ({v})" for k, v in missing.items())
    return (f"config.reward.sandbox='strict': the code sandbox lacks {lacking} on this host, so "
            f"no model-written code is run. Give the host what the layer needs (README, code "
            f"sandbox) or set config.reward.sandbox='best_effort' to score with the layers it "
            f"has ({active}).")


@functools.lru_cache(maxsize=1)
def sandbox_report() -> dict:
    """The sandbox layers this host gives, probed once per process by running a trivial
    program with every layer: {"active": [layers], "missing": {layer: why}, "landlock_abi": int,
    "euid": the trainer's euid, "strict_ok": whether sandbox="strict" can run code}."""
    result = run_tests("print('ok')", [{"input": "", "output": "ok"}], timeout_s=5.0,
                       memory_mb=256, sandbox="best_effort")
    missing = dict(entry.split(": ", 1) for entry in result.missing)
    if not result.passed:  # the probe itself failed: nothing can be vouched for
        missing = {name: f"probe failed: {result.reason}" for name in REQUIRED}
    active = [name for name in result.isolation if name not in missing]
    return {"active": active, "missing": missing, "landlock_abi": result.landlock_abi,
            "euid": os.geteuid(), "strict_ok": not set(REQUIRED) & set(missing)}


def sandbox_summary(sandbox: str) -> str:
    """One log line: the mode and the layers active / missing on this host (notes: states that
    are not layers of their own, e.g. an interpreter uid 65534 cannot read)."""
    report = sandbox_report()
    missing = [f"{k} ({v})" for k, v in report["missing"].items() if k in REQUIRED]
    notes = [f"{k} ({v})" for k, v in report["missing"].items() if k not in REQUIRED]
    return (f"code sandbox (config.reward.sandbox={sandbox_mode(sandbox)!r}, euid "
            f"{report['euid']}, Landlock ABI {report['landlock_abi']}): active "
            f"{', '.join(report['active'])}; missing {', '.join(missing) or 'none'}"
            + (f"; notes: {', '.join(notes)}" if notes else ""))


def require_sandbox(sandbox: str) -> str:
    """Returns `sandbox`; raises SandboxUnavailable when it is "strict" and the host lacks a
    required layer (called once at start-up, and before every strict run)."""
    report = sandbox_report()
    if sandbox_mode(sandbox) == "strict" and not report["strict_ok"]:
        missing = {k: v for k, v in report["missing"].items() if k in REQUIRED}
        raise SandboxUnavailable(_refusal(missing, {k: None for k in report["active"]}))
    return sandbox


@REWARDS.register("code")
def code_reward(record: dict, response: str, *, timeout_s: float = 6.0,
                memory_mb: int = 1024, sandbox: str = "strict") -> tuple[bool, dict]:
    """Verifier for code tasks: the response's last ```python block must pass every test of
    the record (public, then private ones, decoded here). The record's own time and memory
    limits apply when they are more generous than timeout_s / memory_mb. sandbox: "strict" or
    "best_effort" (config.reward.sandbox; see the module docstring)."""
    program = extract_code(response)
    if program is None:
        return False, {"reason": "no ```python code block in the response", "answer": None}
    tests = list(record["tests"])
    if record.get("private_tests_encoded"):
        tests += decode_lcb_tests(record["private_tests_encoded"])
    result = run_tests(program, tests, fn_name=record.get("fn_name"),
                       timeout_s=max(timeout_s, record.get("time_limit_s") or 0),
                       memory_mb=int(max(memory_mb, record.get("memory_limit_mb") or 0)),
                       sandbox=sandbox)
    return result.passed, {"reason": result.reason, "answer": program,
                           "num_passed": result.num_passed, "num_tests": result.num_tests}
