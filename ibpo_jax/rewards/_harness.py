"""Sandbox harness: runs one untrusted Python program against its tests (stdlib only).

`ibpo_jax.rewards.code.run_tests` copies this file into a fresh temporary directory and starts
it as `python -I -B harness.py config.json` in a new session (its own process group) with an
empty environment. It is never imported by the package; it runs only as that script.

The harness (trusted) first confines itself, and so everything it forks:
  * dies with its parent (PR_SET_PDEATHSIG), so a killed reward worker leaves no sandbox behind;
  * rlimits: address space (memory), CPU seconds per process, file size (= the output cap,
    stdout and stderr are files), open files, core dumps off, and process count (RLIMIT_NPROC is
    relative to the processes the user already runs; the kernel never enforces it for root);
  * Landlock, when the kernel offers it: no file system writes outside the temporary
    directory, no TCP bind/connect (ABI >= 4), no signals or abstract sockets out of the
    sandbox (ABI >= 6).
Then, for each test, it forks a child that redirects fds 0/1/2 to the test's files, installs an
audit hook (denies process creation, exec, signals, sockets, ctypes and C-level I/O modules,
every file write or file system change, and reads of /proc) and executes the program; the
harness kills the child at the per-test time limit. It stops at the first test that does not
exit cleanly and writes status.json. It never sees expected outputs: the parent compares them,
so a program cannot forge a verdict.
"""

import builtins
import io
import json
import os
import resource
import signal
import struct
import sys
import threading
import time
import traceback

PREAMBLE = (
    "from typing import *; import sys, math, re, heapq, bisect, itertools, functools, "
    "collections, string; from collections import deque, defaultdict, Counter, OrderedDict; "
    "from functools import lru_cache, cache, reduce; from itertools import accumulate, "
    "permutations, combinations, product; from heapq import heappush, heappop, heapify; "
    "from bisect import bisect_left, bisect_right, insort; from math import inf, gcd, sqrt, "
    "ceil, floor, comb, log, log2, isqrt\n")
DENIED_EVENTS = ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
                 "os.kill", "os.killpg", "os.startfile", "subprocess.Popen", "pty.spawn",
                 "socket.__new__", "socket.connect", "socket.bind", "signal.pthread_kill")
DENIED_MODULES = ("ctypes", "_ctypes", "cffi", "_posixsubprocess", "sqlite3", "_sqlite3", "dbm",
                  "_dbm", "_gdbm", "multiprocessing", "_multiprocessing")
PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
               "os.chmod", "os.chown", "os.truncate", "os.utime", "shutil.rmtree", "os.mkfifo",
               "os.mknod")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

# Landlock (linux/landlock.h); syscall numbers are the same on x86_64 and arm64.
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
FS_WRITE_FILE, FS_TRUNCATE = 1 << 1, 1 << 14
FS_WRITE_ALL_V1 = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))
FS_REFER = 1 << 13


def _libc():
    import ctypes
    return ctypes, ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent_pid):
    ctypes, libc = _libc()
    libc.prctl(ctypes.c_int(1), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
               ctypes.c_ulong(0), ctypes.c_ulong(0))  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(70)


def count_user_tasks(uid):
    """Tasks (threads) the user runs now: what RLIMIT_NPROC counts."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


def set_limits(cfg):
    cpu = int(cfg["timeout_s"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_bytes"], cfg["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["max_output_bytes"], cfg["max_output_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.geteuid() != 0:
        nproc = count_user_tasks(os.getuid()) + cfg["max_processes"]
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def landlock(workdir):
    """Confines writes to `workdir` (+ /dev/null), and TCP and signals where supported.

    Returns the Landlock ABI version applied, or 0 when the kernel does not offer Landlock."""
    ctypes, libc = _libc()
    c = ctypes.c_long
    abi = libc.syscall(c(SYS_CREATE_RULESET), None, c(0), c(1))  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return 0
    fs = FS_WRITE_ALL_V1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    net = 0b11 if abi >= 4 else 0  # BIND_TCP | CONNECT_TCP: no rule allows any port
    scoped = 0b11 if abi >= 6 else 0  # ABSTRACT_UNIX_SOCKET | SIGNAL
    attr = struct.pack("=QQQ", fs, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = libc.syscall(c(SYS_CREATE_RULESET), ctypes.c_char_p(attr), c(len(attr)), c(0))
    if ruleset < 0:
        return 0
    try:
        file_rights = FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0)
        for path, rights in ((workdir, fs), ("/dev/null", file_rights)):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            rule = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr (packed)
            added = libc.syscall(c(SYS_ADD_RULE), c(ruleset), c(1), ctypes.c_char_p(rule), c(0))
            os.close(fd)
            if added != 0:
                return 0
        libc.prctl(ctypes.c_int(38), ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                   ctypes.c_ulong(0))  # PR_SET_NO_NEW_PRIVS, required by restrict_self
        if libc.syscall(c(SYS_RESTRICT_SELF), c(ruleset), c(0)) != 0:
            return 0
        return abi
    finally:
        os.close(ruleset)


def install_audit_hook():
    """Denies what the program must not do (see DENIED_*, and every file write or file system
    change: a program's only outputs are its stdout and stderr, already open as fds 1 and 2);
    the operation raises PermissionError naming it."""
    for name in [m for m in sys.modules if m.split(".")[0] in DENIED_MODULES]:
        del sys.modules[name]  # the harness itself used ctypes: force a (denied) re-import
    real, fsdecode = os.path.realpath, os.fsdecode

    def hook(event, args):
        if event in DENIED_EVENTS or event in PATH_EVENTS or event.startswith("ctypes."):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0].split(".")[0] in DENIED_MODULES:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        if event == "open" and isinstance(args[0], str | bytes | os.PathLike):
            path, mode, flags = args
            resolved = real(fsdecode(path))
            writes = (isinstance(mode, str) and any(ch in mode for ch in "wax+")) or (
                isinstance(flags, int) and flags & WRITE_FLAGS)
            if writes and resolved != "/dev/null":
                raise PermissionError(f"sandbox: writing {resolved} is not allowed")
            if resolved == "/proc" or resolved.startswith("/proc/"):
                raise PermissionError(f"sandbox: reading {resolved} is not allowed")

    sys.addaudithook(hook)


def text_stream(fd, mode):
    raw = io.FileIO(fd, mode, closefd=False)
    buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, encoding="utf-8", errors="replace")


def run_child(code, test, fn_name, fds):
    """In the forked child: execute the program on one test; never returns."""
    in_fd, out_fd, err_fd, res_fd = fds
    for src, dst in ((in_fd, 0), (out_fd, 1), (err_fd, 2)):
        os.dup2(src, dst)
    sys.stdin, sys.stdout, sys.stderr = text_stream(0, "r"), text_stream(1, "w"), text_stream(2,
                                                                                             "w")
    args_text = sys.stdin.read() if test["kind"] == "call" else None
    install_audit_hook()
    status = 0
    try:
        if test["kind"] == "stdio":
            exec(code, {"__name__": "__main__", "__builtins__": builtins})
        else:
            namespace = {"__name__": "solution", "__builtins__": builtins}
            exec(code, namespace)
            target = (getattr(namespace["Solution"](), fn_name) if "Solution" in namespace
                      else namespace[fn_name])
            args = [json.loads(line) for line in args_text.split("\n")]
            result = target(*args)
            result = list(result) if isinstance(result, tuple) else result
            os.write(res_fd, json.dumps(result).encode())
    except SystemExit as e:
        status = 0 if e.code in (None, 0) else e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - report everything the program raised
        traceback.print_exc()
        status = 1
    for thread in threading.enumerate():  # as at interpreter exit: wait for non-daemon threads
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    try:
        sys.stdout.flush()
    except OSError:  # e.g. EFBIG: the output cap
        traceback.print_exc()
        status = status or 1
    try:
        sys.stderr.flush()
    except OSError:
        pass
    os._exit(status & 0xFF)


def run_test(k, test, code, cfg, workdir):
    paths = {name: os.path.join(workdir, f"{name}_{k}.txt") for name in ("out", "err", "res")}
    in_fd = os.open(os.path.join(workdir, test["input"]), os.O_RDONLY)
    fds = [in_fd] + [os.open(paths[n], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                     for n in ("out", "err", "res")]
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            die_with_parent(os.getppid())
            run_child(code, test, cfg["fn_name"], fds)
        finally:
            os._exit(71)
    for fd in fds:
        os.close(fd)
    deadline, delay, timed_out = start + cfg["timeout_s"], 0.0005, False
    while True:
        done, wait_status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            _, wait_status, usage = os.wait4(pid, 0)
            timed_out = True
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.01)
    sig = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
    exit_code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None
    if timed_out or sig in (signal.SIGXCPU, signal.SIGKILL):
        status = "timeout"
    else:
        status = "ok" if exit_code == 0 else "error"
    return {"status": status, "exit_code": exit_code,
            "signal": None if sig is None else signal.Signals(sig).name,
            "time_s": round(time.monotonic() - start, 4),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 4)}


def main(config_path):
    workdir = os.path.dirname(os.path.abspath(config_path))
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    die_with_parent(cfg["parent_pid"])
    set_limits(cfg)
    isolation = ["session", "rlimits", "audit_hook"]
    abi = landlock(workdir)
    if abi:
        isolation.append(f"landlock_v{abi}")
    report = {"isolation": isolation, "compile_error": None, "tests": []}
    with open(os.path.join(workdir, "program.py"), encoding="utf-8") as f:
        source = f.read()
    try:
        code = compile(PREAMBLE + source, "program.py", "exec")
    except (SyntaxError, ValueError) as e:
        report["compile_error"] = f"{type(e).__name__}: {e}"
    else:
        for k, test in enumerate(cfg["tests"]):
            result = run_test(k, test, code, cfg, workdir)
            report["tests"].append(result)
            if result["status"] != "ok":
                break
    tmp = os.path.join(workdir, "status.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f)
    os.replace(tmp, os.path.join(workdir, "status.json"))


if __name__ == "__main__":
    main(sys.argv[1])
