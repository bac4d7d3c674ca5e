"""Code reward: LiveCodeBench-style verdicts, the fixture problems, and hostile programs that
must all be contained and scored as failures while this test process stays unharmed."""

import importlib.util
import json
import os
import subprocess

import pytest

from ibpo_jax.data import formats
from ibpo_jax.rewards import code, get_reward, run_tests
from ibpo_jax.rewards.code import extract_code, stdio_equal

FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "data", "fixtures")
ONE_TEST = [{"input": "", "output": "ok\n"}]


def host_mode():
    """strict where this host has every required layer, else best_effort (test_sandbox_layers
    asserts that strict refuses there)."""
    return "strict" if code.sandbox_report()["strict_ok"] else "best_effort"


def code_reward():
    return get_reward("code", timeout_s=3.0, memory_mb=512, sandbox=host_mode())


@pytest.fixture
def sandbox_pids(monkeypatch):
    """Records the pid (= process group and session id) of every sandbox started."""
    pids, popen = [], subprocess.Popen

    def spy(*args, **kwargs):
        proc = popen(*args, **kwargs)
        pids.append(proc.pid)
        return proc

    monkeypatch.setattr(code.subprocess, "Popen", spy)
    return pids


def survivors(session_ids):
    """Processes still alive in any of the given sessions."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        session = int(stat[stat.rindex(")") + 2:].split()[3])
        if session in session_ids:
            alive.append(int(pid))
    return alive


def run(program, tests=ONE_TEST, **kwargs):
    kwargs = {"timeout_s": 2.0, "memory_mb": 512, "sandbox": host_mode(), **kwargs}
    return run_tests(program, tests, **kwargs)


def test_extract_code_and_stdio_comparison():
    text = "```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```\n``` \nprint(3)\n```"
    assert extract_code(text) == "print(3)\n"
    assert extract_code("```python\nx = 1\n```") == "x = 1\n"
    assert extract_code("no code") is None
    assert stdio_equal("3 \n4\n\n", "3\n4")
    assert stdio_equal("1.0 2\n", "1 2.00")  # token-wise decimal equality
    assert not stdio_equal("1.0000001", "1")
    assert not stdio_equal("3\n4", "3")
    assert not stdio_equal("abc", "abd")


@pytest.mark.parametrize("program, passed, reason", [
    ("print(int(input()) * 2)", True, "passed"),
    ("import sys\nprint(int(sys.stdin.buffer.read()) * 2)\nsys.exit(0)", True, "passed"),
    ("print(int(open(0).read()) * 2)", True, "passed"),
    # The deep-recursion idiom: the work runs in a thread that outlives the module's code.
    ("import threading\nthreading.stack_size(1 << 26)\n"
     "threading.Thread(target=lambda: print(int(input()) * 2)).start()", True, "passed"),
    ("print(int(input()) * 3)", False, "test 0: wrong answer"),
    ("print(int(input() * 2)", False, "compile error: SyntaxError"),
    ("raise KeyError('boom')", False, "test 0: runtime error (exit code 1): KeyError: 'boom'"),
    ("import sys\nprint(42)\nsys.exit(3)", False, "test 0: runtime error (exit code 3)"),
])
def test_stdio_verdicts(program, passed, reason):
    result = run(program, [{"input": "21\n", "output": "42\n"}, {"input": "5", "output": "10"}])
    assert result.passed is passed
    assert result.reason.startswith(reason), result.reason
    assert result.num_passed == (2 if passed else 0)
    assert "rlimits" in result.isolation and "audit_hook" in result.isolation


def test_call_based_verdicts():
    tests = [{"input": "[3, 1, 2]\n1", "output": "[2, 3, 4]", "kind": "call"},
             {"input": "[]\n5", "output": "[]", "kind": "call"}]
    good = ("class Solution:\n    def addAll(self, nums: List[int], k: int) -> List[int]:\n"
            "        print('debug output is ignored')\n"
            "        return tuple(sorted(x + k for x in nums))\n")
    assert run(good, tests, fn_name="addAll").passed
    wrong = good.replace("x + k", "x - k")
    result = run(wrong, tests, fn_name="addAll")
    assert not result.passed and result.reason.startswith("test 0: wrong answer")
    function = "def addAll(nums, k):\n    return sorted(x + k for x in nums)\n"
    assert run(function, tests, fn_name="addAll").passed
    with pytest.raises(ValueError, match="no fn_name"):
        run(good, tests)
    with pytest.raises(ValueError, match="no tests"):
        run(good, [])


def test_fixture_problems():
    lcb_stdin, lcb_call = formats.load_records("livecodebench",
                                               os.path.join(FIXTURES, "livecodebench.jsonl"))
    (cf,) = formats.load_records("codeforces", os.path.join(FIXTURES, "codeforces.parquet"))
    reward = code_reward()
    summing = "```python\ninput()\nprint(sum(map(int, input().split())))\n```"
    result = reward(lcb_stdin, summing)
    assert result.reward == 1.0 and result.info["num_tests"] == 3, result.info["reason"]
    public_only = reward(lcb_stdin, "```python\nprint(6)\n```")  # hard-codes the public answer
    assert public_only.reward == -1.0 and public_only.info["num_passed"] == 1
    assert public_only.info["reason"].startswith("test 1: wrong answer")
    pair = ("```python\nclass Solution:\n    def maxPairSum(self, nums: List[int], k: int) -> "
            "int:\n        a = sorted(nums)\n        return a[-1] + a[-2] + k\n```")
    assert reward(lcb_call, pair).reward == 1.0
    adding = "Here:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert reward(cf, adding).info["num_passed"] == 3
    missing = reward(cf, "I would add them.")
    assert missing.reward == -1.0 and missing.info["reason"].startswith("no ```python")


# ---- hostile programs -------------------------------------------------------------------------

def test_infinite_loop_is_killed_at_the_time_limit(sandbox_pids):
    result = run("while True:\n    pass", timeout_s=1.0)
    assert not result.passed and result.reason == "test 0: time limit exceeded (1 s)"
    assert 1.0 <= result.tests[0]["time_s"] < 3.0
    assert survivors(sandbox_pids) == []


FORK_200 = """
import os, time
for _ in range(200):
    if os.fork() == 0:
        time.sleep(1000)
        os._exit(0)
print("ok")
"""
FORK_200_STUBBORN = """
import os, time, threading
for _ in range(200):
    try:
        if os.fork() == 0:
            time.sleep(1000)
    except PermissionError:  # no fork: fall back to sleeping threads, as many as allowed
        try:
            threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()
        except RuntimeError:
            pass
print("ok", flush=True)
time.sleep(1000)
"""


def test_two_hundred_sleeping_children_are_contained(sandbox_pids):
    result = run(FORK_200)
    assert not result.passed and "os.fork is not allowed" in result.reason
    stubborn = run(FORK_200_STUBBORN, timeout_s=1.0)
    assert not stubborn.passed and "time limit exceeded" in stubborn.reason
    assert survivors(sandbox_pids) == []


def test_allocating_8_gb_hits_the_memory_limit():
    result = run("x = bytearray(8 * 1024 ** 3)\nprint('ok')", memory_mb=256)
    assert not result.passed and result.reason.startswith("test 0: memory limit exceeded")


@pytest.mark.parametrize("program", [
    "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)",
    "import os\nchunk = b'x' * (1 << 20)\nfor _ in range(1024):\n    os.write(1, chunk)",
])
def test_writing_1_gb_to_stdout_hits_the_output_cap(program):
    result = run(program, max_output_bytes=1 << 20)
    assert not result.passed
    assert result.reason == "test 0: output limit exceeded (1048576 bytes)"


@pytest.mark.parametrize("how", [
    "open({path!r}, 'w').write('x')",
    "import os\nos.close(os.open({path!r}, os.O_CREAT | os.O_WRONLY))",
    "import sqlite3\nsqlite3.connect({path!r}).execute('create table t (x)')",
    "import os\nos.rename('program.py', {path!r})",
    "open('inside_the_temp_dir_too.txt', 'w').write('x' * (1 << 20))",  # no disk filling either
])
def test_writing_files_is_denied(tmp_path, how):
    target = tmp_path / "escaped.txt"
    result = run(how.format(path=str(target)) + "\nprint('ok')")
    assert not result.passed and "PermissionError: sandbox:" in result.reason
    assert not target.exists()


@pytest.mark.parametrize("how", [
    "import socket\nsocket.socket().connect(('127.0.0.1', 9))",
    "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
    "import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)",
])
def test_network_sockets_are_denied(how):
    result = run(how + "\nprint('ok')")
    assert not result.passed and "sandbox: socket.__new__ is not allowed" in result.reason


def test_parent_environment_is_not_readable(monkeypatch):
    secret = "s3cr3t-value-123"
    monkeypatch.setenv("IBPO_SANDBOX_SECRET", secret)
    expect = [{"input": "", "output": "anything"}]  # what the program printed is in the reason
    from_env = run("import os\nprint(os.environ.get('IBPO_SANDBOX_SECRET'))\n"
                   "print(sorted(os.environ))", expect)
    assert from_env.reason.startswith("test 0: wrong answer")
    assert "got \"None\\n['HOME', 'LANG', 'PATH', 'TMPDIR']" in from_env.reason
    assert secret not in repr(from_env)
    from_proc = run("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())", expect)
    assert not from_proc.passed and "sandbox: reading /proc/" in from_proc.reason
    assert secret not in repr(from_proc)
    assert os.environ["IBPO_SANDBOX_SECRET"] == secret


def test_signalling_the_parent_is_denied():
    result = run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('ok')")
    assert not result.passed and "sandbox: os.kill is not allowed" in result.reason


def test_rlimit_nproc_counts_this_users_tasks():
    """Outside a user namespace the process budget is relative to this count of tasks."""
    spec = importlib.util.spec_from_file_location("layers", code.LAYERS_FILE)
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    with subprocess.Popen(["sleep", "30"]) as child:
        ours = len(os.listdir("/proc/self/task"))
        total = layers.count_user_tasks(os.getuid())
        child.kill()
    assert total >= ours + 1  # our threads plus at least the child
    assert layers.count_user_tasks(2**31 - 7) == 0  # a uid with no processes


def test_sandbox_report_is_json_clean():
    result = run("print('ok')")
    assert result.passed and json.loads(json.dumps(result.tests))[0]["verdict"] == "passed"
