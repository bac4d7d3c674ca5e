"""Sandbox harness: runs one untrusted Python program against its tests (stdlib only).

`ibpo_jax.rewards.code.run_tests` copies this file and `_layers.py` into a fresh temporary
directory and starts `python -I -B harness.py config.json ALIVE_FD` there, in a new session,
with an empty environment; ALIVE_FD is the read end of a pipe only the trainer writes to. The
config holds limits, file names and the layers to apply, nothing of the trainer's (no pid, no
path outside the directory). The harness is never imported by the package.

Processes, each dying with its parent (PR_SET_PDEATHSIG, armed race-free with a pipe):
  H  this script: as root, hands the directory to uid 65534 and opens the Landlock rules; forks
  I  unshares a user, PID and network namespace (H writes its uid/gid map: inside 65534 ->
     outside 65534 as root, -> the trainer's own uid otherwise) and takes the unprivileged id;
     forks
  J  pid 1 of the new PID namespace: rlimits, Landlock (reads below the interpreter's
     directories, writes in the sandbox directory), seccomp; for each test it forks
  C  which applies a second Landlock domain (no writes, no sandbox directory), the audit hook
     (a fast early "no", not a boundary: the program shares its interpreter), and runs the
     program with fds 0/1/2 on the test's files.
After each test J kills every other process of the namespace; when J exits the kernel kills
whatever is left, so nothing survives the sandbox. J stops at the first test that does not exit
cleanly and writes status.json, with every layer's state; when a layer in config["required"] is
missing it runs nothing ("refused"). The harness never sees expected outputs.
"""

import builtins
import importlib
import importlib.util
import io
import json
import os
import signal
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
# The preamble's modules are imported once, before the fork of any test. When a root trainer's
# interpreter lives where uid 65534 cannot read (e.g. under a 0700 /root), PRELOAD too: then
# these are the only standard modules a program can import.
PREAMBLE_MODULES = ("typing", "math", "re", "heapq", "bisect", "itertools", "functools",
                    "collections", "string")
PRELOAD = ("fractions", "decimal", "random", "operator", "copy", "array", "statistics",
           "datetime", "time", "json", "queue", "enum", "dataclasses", "numbers", "cmath",
           "struct", "textwrap", "calendar", "unicodedata", "encodings.ascii",
           "encodings.latin_1", "encodings.idna",
           "socket")  # socket, idna: the hook or the kernel, not a missing file, deny sockets
# Layers a config may switch on; "rlimits" and the empty environment are always on.
TOGGLES = ("pid_namespace", "net_namespace", "unprivileged_uid", "landlock", "seccomp",
           "audit_hook")
INSIDE_ID = 65534  # the program's uid and gid inside its user namespace


def world_readable(path):
    """Whether any uid may list `path` (o+rx) and reach it (o+x on every parent)."""
    mode = os.stat(path).st_mode
    if mode & 0o005 != 0o005:
        return False
    while path != os.path.dirname(path):
        path = os.path.dirname(path)
        if not os.stat(path).st_mode & 0o001:
            return False
    return True


def preload(drop):
    """Imports the preamble's modules, and PRELOAD when the uid drop will cut the stdlib off."""
    names = PREAMBLE_MODULES
    if drop and not world_readable(os.path.dirname(os.__file__)):
        names += PRELOAD
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def load_layers():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_layers.py")
    spec = importlib.util.spec_from_file_location("_sandbox_layers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def execute(code, test, fn_name, res_fd):
    """Runs the program (and the call-based target); returns its exit status."""
    args_text = sys.stdin.read() if test["kind"] == "call" else None
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
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
        return 0 if e.code in (None, 0) else e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - report everything the program raised
        traceback.print_exc()
        return 1
    return 0


def run_child(code, test, cfg, fds, box):
    """In C, the forked child: confine, execute the program on one test; never returns."""
    in_fd, out_fd, err_fd, res_fd = fds
    for src, dst in ((in_fd, 0), (out_fd, 1), (err_fd, 2)):
        os.dup2(src, dst)
    if box["layers"]["landlock"] is None:
        abi, err = box["L"].landlock(box["rules"][0])
        if err:
            print(f"sandbox: program's Landlock domain failed: {err}", file=sys.stderr)
            os._exit(72)
    for fd in [in_fd, out_fd, err_fd, box["alive"]] + [fd for fd, _ in box["rules"][1]]:
        os.close(fd)  # nothing of the harness's stays open but fds 0-2 and the result file
    sys.stdin, sys.stdout, sys.stderr = (text_stream(0, "r"), text_stream(1, "w"),
                                         text_stream(2, "w"))
    if "audit_hook" in cfg["layers"]:
        install_audit_hook()
    status = execute(code, test, cfg["fn_name"], res_fd)
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


def kill_the_rest():
    """As pid 1 of the PID namespace: SIGKILL every other process in it and reap them all."""
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def wait_child(pid, deadline):
    """(wait status, rusage, timed out) of child `pid`, SIGKILLed at `deadline` (monotonic)."""
    delay = 0.0005
    while True:
        done, wait_status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return wait_status, usage, False
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            _, wait_status, usage = os.wait4(pid, 0)
            return wait_status, usage, True
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def run_test(k, test, code, cfg, box):
    fds = [os.open(test["input"], os.O_RDONLY)] + [
        os.open(f"{name}_{k}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for name in ("out", "err", "res")]
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            box["L"].die_with_parent(box["alive"])
            run_child(code, test, cfg, fds, box)
        finally:
            os._exit(71)
    for fd in fds:
        os.close(fd)
    wait_status, usage, timed_out = wait_child(pid, start + cfg["timeout_s"])
    if os.getpid() == 1:
        kill_the_rest()
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


def confine(cfg, box):
    """In J: rlimits, then the Landlock domain and seccomp filter every test inherits."""
    L, layers = box["L"], box["layers"]
    nproc = None
    if layers["unprivileged_uid"] is None:  # RLIMIT_NPROC binds: I, J and C, + the program's
        own = 3 if layers["user_namespace"] is None else L.count_user_tasks(os.getuid()) + 1
        nproc = own + cfg["max_processes"]
    L.set_rlimits(cfg["timeout_s"], cfg["memory_bytes"], cfg["max_output_bytes"], nproc)
    layers["rlimits"] = None
    stdlib = os.path.dirname(os.__file__)
    layers["stdlib_readable"] = None if os.access(stdlib, os.R_OK | os.X_OK) else (
        f"{stdlib} is not readable by uid {os.getuid()}: only the preloaded modules import")
    if "landlock" in cfg["layers"]:
        box["landlock_abi"], layers["landlock"] = L.landlock(box["rules"][1])
    if "seccomp" in cfg["layers"]:
        layers["seccomp"] = L.seccomp()
    if "audit_hook" in cfg["layers"]:
        layers["audit_hook"] = None


def sandbox_main(cfg, box):
    """J: confine, then run the tests unless a required layer is missing; writes status.json."""
    box["L"].die_with_parent(box["alive"])
    os.close(box["alive"])
    box["alive"], _ = os.pipe()  # each test's child dies with J; J keeps the write end
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # pid 1 then ignores it from inside the ns
    confine(cfg, box)
    refused = {k: box["layers"][k] for k in cfg["required"] if box["layers"][k] is not None}
    report = {"layers": box["layers"], "landlock_abi": box["landlock_abi"],
              "refused": refused or None, "compile_error": None, "tests": []}
    if not refused:
        with open("program.py", encoding="utf-8") as f:
            source = f.read()
        try:
            code = compile(PREAMBLE + source, "program.py", "exec")
        except (SyntaxError, ValueError) as e:
            report["compile_error"] = f"{type(e).__name__}: {e}"
        else:
            for k, test in enumerate(cfg["tests"]):
                result = run_test(k, test, code, cfg, box)
                report["tests"].append(result)
                if result["status"] != "ok":
                    break
    with open("status.json.tmp", "w", encoding="utf-8") as f:
        json.dump(report, f)
    os.replace("status.json.tmp", "status.json")


def enter_namespaces(cfg, box, pipes):
    """In I: the user (when needed), PID and network namespaces, then the unprivileged ids."""
    L, layers, root = box["L"], box["layers"], os.geteuid() == 0
    ready_w, go_r = pipes
    flags = ((L.CLONE_NEWPID if "pid_namespace" in cfg["layers"] else 0)
             | (L.CLONE_NEWNET if "net_namespace" in cfg["layers"] else 0))
    userns = bool(flags) and (not root or box["drop"])  # root keeping uid 0 needs none
    err = None
    if flags:
        if box["drop"]:
            os.setgroups([])  # inside a user namespace groups can no longer be dropped
        err = L.unshare(flags | (L.CLONE_NEWUSER if userns else 0))
        if err and userns and root:  # root can do without a user namespace
            userns, err = False, L.unshare(flags)
    os.write(ready_w, b"u" if userns and not err else b"-")
    if userns and not err:
        err = os.read(go_r, 4096).decode() or None  # H wrote our uid/gid maps
    layers["user_namespace"] = err if userns else "not used"
    for name, flag in (("pid_namespace", L.CLONE_NEWPID), ("net_namespace", L.CLONE_NEWNET)):
        if flags & flag:
            layers[name] = err
    if userns and not err:
        layers["unprivileged_uid"] = L.become(INSIDE_ID, INSIDE_ID, clear_groups=False)
    elif box["drop"]:
        layers["unprivileged_uid"] = L.become(L.NOBODY, L.NOBODY, clear_groups=True)
    elif not root:
        layers["unprivileged_uid"] = None
    else:
        layers["unprivileged_uid"] = "disabled: running as root"


def fork_with_lifeline(body):
    """Forks a child that dies with this process and runs body(alive_fd); returns its pid."""
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(alive_w)
            body(alive_r)
        finally:
            os._exit(71)
    os.close(alive_r)
    return pid


def isolated_main(cfg, box, pipes, alive):
    """I: namespaces and ids, then J as the first process of the new PID namespace."""
    box["L"].die_with_parent(alive)
    ready_r, ready_w, go_r, go_w = pipes
    os.close(ready_r)
    os.close(go_w)
    enter_namespaces(cfg, box, (ready_w, go_r))
    os.close(ready_w)
    os.close(go_r)
    box["L"].die_with_parent(alive)  # a change of uid disarms PR_SET_PDEATHSIG
    os.close(alive)

    def sandbox(fd):
        box["alive"] = fd
        sandbox_main(cfg, box)
        os._exit(0)

    _, wait_status = os.waitpid(fork_with_lifeline(sandbox), 0)
    os._exit(os.waitstatus_to_exitcode(wait_status) & 0xFF)


def main(config_path, alive_fd):
    L = load_layers()
    L.die_with_parent(alive_fd)
    os.close(alive_fd)
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    layers = {name: "disabled" for name in TOGGLES + ("user_namespace", "rlimits",
                                                      "stdlib_readable")}
    drop = os.geteuid() == 0 and "unprivileged_uid" in cfg["layers"]
    preload(drop)
    if drop:  # the sandbox's own directory goes to the unprivileged uid
        for name in os.listdir(".") + ["."]:
            os.chown(name, L.NOBODY, L.NOBODY)
    rules = (L.open_rules(L.read_allowlist(), ".") if "landlock" in cfg["layers"]
             else ([], []))
    box = {"L": L, "layers": layers, "drop": drop, "rules": rules, "landlock_abi": 0}
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pipes = (ready_r, ready_w, go_r, go_w)
    pid = fork_with_lifeline(lambda fd: isolated_main(cfg, box, pipes, fd))
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) == b"u":  # I is in a new user namespace: map its ids
        outer = (L.NOBODY, L.NOBODY) if drop else (os.geteuid(), os.getegid())
        os.write(go_w, (L.write_id_maps(pid, INSIDE_ID, *outer) or "").encode())
    os.close(go_w)
    _, wait_status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(wait_status) & 0xFF)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
