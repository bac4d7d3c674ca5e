"""The code sandbox's kernel layers, one at a time: each hostile program first disables the
audit hook (it shares the program's interpreter, so it can be tampered with), then tries an
escape that only the layer under test stops; the checks are made from this (the host's) side.
A control run without the layer shows each escape is real. Where the host lacks a layer (an
unprivileged user without user namespaces, an old kernel), `sandbox_report()` says so and the
test asserts that sandbox="strict" refuses to run code instead. Passes as root and as an
unprivileged user."""

import dataclasses
import errno
import importlib.util
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import pytest

from ibpo_jax import config
from ibpo_jax.rewards import code, run_tests
from ibpo_jax.rewards.code import REQUIRED, SandboxUnavailable
from ibpo_jax.trainer import parts

OK = [{"input": "", "output": "ok"}]
# Disables the audit hook (its deny-lists and its code), and finds ctypes without importing it.
TAMPER = """
import gc, os, sys
harness = sys.modules["__main__"]
harness.DENIED_EVENTS = harness.PATH_EVENTS = harness.DENIED_MODULES = ()
def _inert(real, fsdecode):
    def hook(event, args):
        return real, fsdecode
    return hook
for f in gc.get_objects():
    if type(f).__name__ == "function" and f.__name__ == "hook" and f.__module__ == "__main__":
        f.__code__ = _inert(None, None).__code__
ctypes = next(m for m in gc.get_objects()
              if type(m).__name__ == "module" and m.__name__ == "ctypes")
libc = ctypes.CDLL(None, use_errno=True)
"""


def hostile(program, layers, **kwargs):
    """Runs TAMPER + program with only `layers` (and the audit hook, which it disables)."""
    return run_tests(TAMPER + program, kwargs.pop("tests", OK), timeout_s=3.0, memory_mb=512,
                     sandbox="best_effort", layers=[*layers, "audit_hook"], **kwargs)


def host_has(layer):
    """Whether this host gives `layer`; where it does not, asserts that strict refuses to run
    code, naming the config key and the layer."""
    report = code.sandbox_report()
    if layer in report["active"]:
        return True
    assert not report["strict_ok"] and layer in report["missing"]
    with pytest.raises(SandboxUnavailable, match=rf"config\.reward\.sandbox.*{layer}"):
        run_tests("print('ok')", OK)
    return False


def processes_named(comm):
    """Live (not zombie) processes whose name is `comm`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
        if name == comm and state not in "ZX":
            found.append(int(pid))
    return found


def test_the_audit_hook_alone_is_not_a_boundary():
    """The tamper works: with only the hook, a program forks and loads ctypes."""
    escape = ("pid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n"
              "print('ok' if libc.getpid() > 0 else 'no')")
    result = hostile(escape, [])
    assert result.passed, result.reason
    assert set(result.isolation) <= {"audit_hook", "rlimits", "stdlib_readable",
                                     "unprivileged_uid"}
    untampered = run_tests("import os\n" + escape, OK, sandbox="best_effort", layers=["audit_hook"])
    assert "sandbox: os.fork is not allowed" in untampered.reason  # the hook, not tampered


SETSID_ESCAPE = """
import time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()  # out of the sandbox's process group and session
    libc.prctl(15, ctypes.c_char_p({name!r}), 0, 0, 0)  # PR_SET_NAME: findable from outside
    os.write(w, b"x")
    time.sleep(1000)
    os._exit(0)
os.read(r, 1)
print("ok")
"""


def test_pid_namespace_alone_leaves_no_survivor():
    name = f"ibpo-esc{os.getpid() % 100000}"
    program = SETSID_ESCAPE.format(name=name.encode())
    control = hostile(program, [])  # without the layer the child lives on, PPID 1
    assert control.passed and (escaped := processes_named(name)), control.reason
    for pid in escaped:
        os.kill(pid, signal.SIGKILL)
    if not host_has("pid_namespace"):
        return
    result = hostile(program, ["pid_namespace"])
    assert result.passed and "pid_namespace" in result.isolation, result.reason
    assert processes_named(name) == []


FORK_BOMB = """
import time
n = 0
try:
    for _ in range(300):
        if os.fork() == 0:
            time.sleep(1000)
            os._exit(0)
        n += 1
except OSError as e:
    print(n, e.errno)
"""


@pytest.mark.sole_sandbox
def test_unprivileged_uid_bounds_a_fork_bomb():
    """RLIMIT_NPROC binds because the sandbox never runs as root (65534 for a root trainer)."""
    if not host_has("unprivileged_uid"):
        return
    result = hostile(FORK_BOMB, ["unprivileged_uid"], max_processes=8)
    assert "unprivileged_uid" in result.isolation and not result.passed
    got = result.reason.split("got ")[1].strip("'\"").split("\\n")[0].split()
    assert int(got[0]) <= 8 and int(got[1]) == errno.EAGAIN, result.reason
    with_namespaces = hostile(FORK_BOMB, ["unprivileged_uid", "pid_namespace"], max_processes=8)
    got = with_namespaces.reason.split("got ")[1].strip("'\"").split("\\n")[0].split()
    assert int(got[0]) <= 8 and int(got[1]) == errno.EAGAIN, with_namespaces.reason


@pytest.fixture
def udp_listener():
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.3)
    yield listener
    listener.close()


def received(listener):
    try:
        return listener.recv(64)
    except (TimeoutError, BlockingIOError):
        return None


UDP_ESCAPE = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b"escaped", ("127.0.0.1", {port}))
print("ok")
"""


@pytest.mark.parametrize("layer, error", [("net_namespace", "Network is unreachable"),
                                          ("seccomp", "PermissionError")])
def test_udp_datagrams_do_not_leave(udp_listener, layer, error):
    program = UDP_ESCAPE.format(port=udp_listener.getsockname()[1])
    assert hostile(program, []).passed and received(udp_listener) == b"escaped"  # control
    if not host_has(layer):
        return
    result = hostile(program, [layer])
    assert not result.passed and error in result.reason, result.reason
    assert received(udp_listener) is None


UNIX_ESCAPE = """
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({path!r})
s.sendall(b"escaped")
print("ok")
"""


def test_seccomp_alone_stops_unix_sockets_on_file_paths():
    """A network namespace does not cover pathname Unix sockets; seccomp denies every socket."""
    where = tempfile.mkdtemp()
    os.chmod(where, 0o755)  # no file permission stands in the way: only the layer
    path = os.path.join(where, "listener.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o777)
        listener.listen(4)
        listener.settimeout(0.3)
        program = UNIX_ESCAPE.format(path=path)
        assert hostile(program, ["net_namespace"]).passed  # control: netns does not stop it
        assert listener.accept()[0].recv(64) == b"escaped"
        if not host_has("seccomp"):
            return
        result = hostile(program, ["seccomp"])
        assert not result.passed and "PermissionError" in result.reason, result.reason
        with pytest.raises(TimeoutError):
            listener.accept()
        calls = ("def call(*args):\n    return libc.syscall(*args), ctypes.get_errno()\n"
                 "print(libc.unshare(0x10000000), ctypes.get_errno(), call(425, 8, None), "
                 "call(0x40000000 | 41, 2, 2, 0))")  # unshare(USER); io_uring_setup; x32 socket
        denied = hostile(calls, ["seccomp"])
        eperm = f"-1 {errno.EPERM} (-1, {errno.EPERM}) (-1, {errno.EPERM})"
        assert f"got '{eperm}" in denied.reason, denied.reason
    finally:
        listener.close()
        os.unlink(path)
        os.rmdir(where)


def run_bpf(program, nr, arch, arg0=0):
    """A classic-BPF interpreter for the instructions the filter uses, on seccomp_data."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    ins = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = ins[pc]
        if op == 0x06:  # ret k
            return k
        if op == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
            continue
        taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
        pc += 1 + (jt if taken else jf)


@pytest.mark.parametrize("machine, socket_nr, read_nr", [("x86_64", 41, 0),
                                                         ("aarch64", 198, 63)])
def test_seccomp_program_verdicts(machine, socket_nr, read_nr):
    """The filter's verdicts for both machines, the one not running here included."""
    spec = importlib.util.spec_from_file_location("layers", code.LAYERS_FILE)
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    arch, denied, clone, clone3 = layers.SECCOMP_ABI[machine]
    program = layers.seccomp_program(machine)
    eperm, allow = layers.RET_ERRNO | errno.EPERM, layers.RET_ALLOW
    assert run_bpf(program, socket_nr, arch) == eperm
    assert all(run_bpf(program, nr, arch) == eperm for nr in denied)
    assert run_bpf(program, read_nr, arch) == allow
    assert run_bpf(program, socket_nr, 0x40000003) == layers.RET_KILL_PROCESS  # i386 / arm32
    assert run_bpf(program, 0x40000000 | socket_nr, arch) == eperm  # x32 numbering
    assert run_bpf(program, clone3, arch) == layers.RET_ERRNO | errno.ENOSYS
    assert run_bpf(program, clone, arch, arg0=0x11 | 0x01200000) == allow  # fork's flags
    for flag in (0x10000000, 0x20000000, 0x40000000, 0x00020000, 0x80):  # USER PID NET NS TIME
        assert run_bpf(program, clone, arch, arg0=0x11 | flag) == eperm


SECRET_ESCAPE = """
root = os.open("/", os.O_PATH | os.O_DIRECTORY)  # a relative path the hook never saw
try:
    fd = os.open("proc/{pid}/environ", os.O_RDONLY, dir_fd=root)
    data = os.read(fd, 1 << 20)
    print([v for v in data.split(b"\\0") if v.startswith(b"IBPO_SANDBOX_SECRET=")])
except OSError as e:
    print("denied", e.errno)
"""


def test_landlock_alone_keeps_the_trainers_environment_secret(monkeypatch):
    """/proc/<pid>/environ holds a process's environment as it was exec'd: a stand-in trainer
    started with the secret, of this test's uid."""
    secret = "s3cr3t-value-456"
    monkeypatch.setenv("IBPO_SANDBOX_SECRET", secret)
    trainer = subprocess.Popen(["sleep", "60"])
    try:
        program = SECRET_ESCAPE.format(pid=trainer.pid)
        assert secret in hostile(program, []).reason  # control: the hook let it through
        if not host_has("landlock"):
            return
        result = hostile(program, ["landlock"])
        assert f"got 'denied {errno.EACCES}" in result.reason and secret not in repr(result)
        assert secret not in repr(hostile("print(dict(os.environ))", []))  # an empty one
    finally:
        trainer.kill()
        trainer.wait()


def test_landlock_alone_denies_reading_host_files():
    where = tempfile.mkdtemp()
    os.chmod(where, 0o755)
    path = os.path.join(where, "host.txt")
    with open(path, "w") as f:
        f.write("host-file-content")
    os.chmod(path, 0o644)
    try:
        program = f"print(open({path!r}).read())"
        assert "host-file-content" in hostile(program, []).reason  # control
        if not host_has("landlock"):
            return
        result = hostile(program, ["landlock"])
        assert "PermissionError" in result.reason and "host-file-content" not in repr(result)
        assert hostile("import csv, fnmatch\nprint('ok')", ["landlock"]).passed  # stdlib reads
        assert hostile("os.execv('/bin/echo', ['echo', 'ok'])", []).passed  # control: exec works
        no_exec = hostile("os.execv('/bin/echo', ['echo', 'ok'])", ["landlock"])
        assert "PermissionError: [Errno 13]" in no_exec.reason, no_exec.reason
    finally:
        os.unlink(path)
        os.rmdir(where)


def test_landlock_scopes_signals_where_the_kernel_can():
    victim = subprocess.Popen(["sleep", "60"])
    try:
        program = f"os.kill({victim.pid}, 9)\nprint('ok')"
        if not host_has("landlock"):
            return
        result = hostile(program, ["landlock"])
        time.sleep(0.05)
        if code.sandbox_report()["landlock_abi"] >= 6:  # LANDLOCK_SCOPE_SIGNAL
            assert "PermissionError" in result.reason and victim.poll() is None
        else:
            assert result.passed and victim.wait(5) == -signal.SIGKILL
    finally:
        victim.kill()
        victim.wait()


def test_nothing_of_the_trainers_reaches_the_program():
    program = ("import json, sys\nprint(sorted(os.environ) == ['HOME', 'LANG', 'PATH', 'TMPDIR'],"
               " [k for k in json.load(open('config.json')) if 'pid' in k], sys.argv[1:2])")
    result = hostile(program, [], tests=[{"input": "", "output": "x"}])
    assert "got \"True [] ['config.json']" in result.reason, result.reason


def test_strict_refuses_a_missing_layer_and_best_effort_opts_in():
    report = code.sandbox_report()
    why = r".*seccomp \(disabled\)" if report["strict_ok"] else ""  # else: the host's first
    with pytest.raises(SandboxUnavailable, match=r"config\.reward\.sandbox='strict'" + why):
        run_tests("print('ok')", OK, layers=[x for x in code.LAYERS if x != "seccomp"])
    with pytest.raises(ValueError, match="config.reward.sandbox must be one of"):
        run_tests("print('ok')", OK, sandbox="lenient")
    assert report["strict_ok"] == (not set(REQUIRED) & set(report["missing"]))
    assert run_tests("print('ok')", OK, sandbox="best_effort").passed
    if report["strict_ok"]:
        assert run_tests("print('ok')", OK).passed
        assert set(REQUIRED) <= set(run_tests("print('ok')", OK).isolation)
    else:
        with pytest.raises(SandboxUnavailable, match="config.reward.sandbox"):
            run_tests("print('ok')", OK)


NO_NAMESPACES = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("layers", sys.argv[1])
layers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layers)
assert layers.seccomp() is None  # like a container's filter: no unshare, so no namespaces
from ibpo_jax.rewards import code
report = code.sandbox_report()
try:
    code.run_tests("print('ok')", [{"input": "", "output": "ok"}])
    refusal = None
except code.SandboxUnavailable as e:
    refusal = str(e)
best = code.run_tests("print('ok')", [{"input": "", "output": "ok"}], sandbox="best_effort")
print(json.dumps({"report": report, "refusal": refusal, "best_effort": best.passed,
                  "summary": code.sandbox_summary("best_effort")}))
"""


def test_a_host_without_namespaces_is_refused_in_strict_mode():
    """A real missing layer: the trainer runs under a seccomp filter that denies unshare(2)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(code.__file__)))
    out = subprocess.run([sys.executable, "-c", NO_NAMESPACES, code.LAYERS_FILE],
                         capture_output=True, text=True, timeout=120, cwd=repo,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [repo] + os.environ.get("PYTHONPATH", "").split(os.pathsep))})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    missing = got["report"]["missing"]
    assert "Operation not permitted" in missing["pid_namespace"], missing
    assert "net_namespace" in missing and not got["report"]["strict_ok"]
    assert "config.reward.sandbox='strict'" in got["refusal"] and "pid_namespace" in \
        got["refusal"] and "best_effort" in got["refusal"]
    assert got["best_effort"] and "missing pid_namespace" in got["summary"]


def test_the_trainer_builds_the_code_reward_with_config_reward_sandbox(capsys):
    base = config.load("configs/grpo.py")
    cfg = dataclasses.replace(base, reward=dataclasses.replace(base.reward, num_workers=0,
                                                               sandbox="best_effort"))
    pool = parts.reward_pool(cfg, "code")
    assert dict(pool.reward.options) == {"sandbox": "best_effort"}
    assert "code sandbox (config.reward.sandbox='best_effort'" in capsys.readouterr().err
    rewards, _ = pool.score([{"tests": [{"input": "2", "output": "4"}]}],
                            ["```python\nprint(int(input()) * 2)\n```"])
    assert rewards.tolist() == [1.0]
    assert parts.reward_pool(cfg, "math").reward.options == ()  # no sandbox option there
    strict = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, sandbox="strict"))
    if code.sandbox_report()["strict_ok"]:
        assert dict(parts.reward_pool(strict, "code").reward.options) == {"sandbox": "strict"}
    else:
        with pytest.raises(SandboxUnavailable, match="config.reward.sandbox"):
            parts.reward_pool(strict, "code")
    with pytest.raises(config.ConfigError, match="config.reward.sandbox"):
        config.load("configs/grpo.py", [("reward.sandbox", "lenient")])
