"""A multi-process run's lost peer, said in one line (issue 60).

jax's distributed runtime ends a process whose peer is gone from C++: the coordinator stops
hearing a process's heartbeat (``train.heartbeat_s``) and every other process aborts with a
check-failure stack; a process whose coordinator died aborts at once. Neither can be caught in
Python (the runtime's error callback is not usable from Python in this jaxlib), so
`ibpo_jax.train` runs a multi-process trainer as a child of a thin watchman (`supervise`, which
starts no jax backend):

- the child sends the runtime's own output (file descriptors 1 and 2: C++ logs, Gloo, the
  abort's stack) to ``<workdir>/runtime_<tag>.log`` and keeps Python's ``sys.stdout`` and
  ``sys.stderr`` (progress bar, one-line errors, warnings) on the terminal
  (`keep_runtime_output`);
- when the child dies of a signal, or stops on a collective's failure (`peer_failure`), the
  watchman reads that log and prints one line: which process was lost and how (`diagnose`), how
  long after the last logged step, the last complete checkpoint, the command that resumes; it
  removes the run's temporary checkpoint directories when no trainer holds the workdir's lock,
  and exits `EXIT_LOST`;
- SIGINT / SIGTERM reach the child (which stops after its step, as a one-process run does),
  and the child dies with the watchman (a killed host takes its trainer with it).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

ENV = "IBPO_RUNTIME_LOG"  # set in the child: where its file descriptors 1 and 2 go
EXIT_LOST = 4  # a multi-process run lost a process: resumable from its last checkpoint
MARK = "ibpo: process "  # the child's own line in its log: "ibpo: process I of N"
_FORWARDED = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1
_PEER_PATTERNS = ("gloo", "connection closed", "socket closed", "unavailable", "heartbeat",
                  "coordination service")


def runtime_log(workdir: str | Path) -> Path:
    """The child's log of the runtime's output: one file per process (a shared workdir)."""
    tag = os.environ.get("JAX_PROCESS_ID") or f"{socket.gethostname()}_{os.getpid()}"
    return Path(workdir).absolute() / f"runtime_{tag}.log"


def supervise(argv: Sequence[str], *, workdir: str | Path, heartbeat_s: int,
              resume: str) -> int:
    """Runs ``python -m ibpo_jax.train ARGV`` as a child and returns its exit code, or, when
    it was lost, prints one line (module docstring) and returns `EXIT_LOST`."""
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    log = runtime_log(workdir)
    parent = os.getpid()
    child = subprocess.Popen([sys.executable, "-m", "ibpo_jax.train", *argv],
                             env={**os.environ, ENV: str(log)}, start_new_session=True,
                             preexec_fn=lambda: _die_with(parent))
    previous = {s: signal.signal(s, lambda signum, _: child.send_signal(signum))
                for s in _FORWARDED}
    try:
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if code >= 0 and code != EXIT_LOST:
        return code
    text = log.read_text(errors="replace") if log.exists() else ""
    what = diagnose(text, code, heartbeat_s)
    removed = _remove_partial_checkpoints(workdir)
    print(f"error: {what}{_since_last_step(workdir)}; {_last_checkpoint(workdir)}"
          f"{removed}; the runtime's output is in {log}; resume with: {resume} (every "
          "process)", file=sys.stderr, flush=True)
    return EXIT_LOST


def diagnose(text: str, code: int, heartbeat_s: int) -> str:
    """What the runtime's log `text` says ended a child that exited with `code` (negative: the
    signal that killed it), in words: the lost process, or how this one ended."""
    mark = re.findall(rf"{MARK}(\d+) of (\d+)", text)
    me, count = (int(mark[-1][0]), int(mark[-1][1])) if mark else (None, None)
    of = f" of {count}" if count else ""
    this = "" if me is None else f" (this is process {me})"
    if code == -signal.SIGKILL:  # never the runtime's doing (it aborts: SIGABRT)
        return (f"this process{'' if me is None else f' ({me}{of})'} was killed (SIGKILL: "
                "the kernel's out-of-memory killer, or kill -9)")
    listed = re.findall(r"stopped sending heartbeats\):\s*((?:\d+\s*,?\s*)+)", text)
    lost = sorted(({int(x) for x in re.findall(r"Task (\d+) heartbeat timeout", text)}
                   | {int(x) for group in listed for x in re.findall(r"\d+", group)}) - {me})
    if lost:
        names = ", ".join(map(str, lost))
        return (f"lost process{'es' if len(lost) > 1 else ''} {names}{of}: no heartbeat "
                f"within train.heartbeat_s={heartbeat_s} s{this}")
    if me not in (None, 0) and re.search(r"Socket closed|failed to connect|Connection refused",
                                         text):
        return f"lost process 0{of}, the coordinator: its connection closed{this}"
    if re.search(r"Gloo \w+ failed|Connection (closed|reset) by peer", text):
        return f"lost a peer{of}: a collective's connection closed{this}"
    how = (f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}")
    return f"the distributed runtime stopped this process ({how}){this}"


def keep_runtime_output(log: str | Path) -> None:
    """In the child: file descriptors 1 and 2 (C++ and Gloo output, an abort's stack) into
    `log`, Python's sys.stdout and sys.stderr kept on the terminal."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for number, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        stream.flush()
        terminal = os.dup(number)
        os.dup2(fd, number)
        setattr(sys, name, open(terminal, "w", buffering=1, errors="backslashreplace"))
    os.close(fd)


def note_process(index: int, count: int) -> None:
    """In the child, once jax.distributed is up: its index, for the watchman's line."""
    os.write(2, f"{MARK}{index} of {count}\n".encode())


def peer_failure(error: BaseException) -> bool:
    """Whether a runtime error raised by a collective reads as a peer's loss."""
    text = str(error).lower()
    return any(p in text for p in _PEER_PATTERNS)


def await_verdict(heartbeat_s: int) -> NoReturn:
    """In the child, after a collective failed with its peer (the traceback logged): waits for
    the runtime to name the lost process (it aborts this one within the heartbeat timeout),
    then exits `EXIT_LOST` without jax's shutdown barrier, which would wait for the dead."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(heartbeat_s + 5)
    os._exit(EXIT_LOST)


def _die_with(parent: int) -> None:
    """In the child before exec: SIGKILL when the watchman dies (Linux; elsewhere a no-op)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the watchman died before prctl
        os._exit(EXIT_LOST)


def _since_last_step(workdir: Path) -> str:
    metrics = workdir / "metrics.jsonl"
    if not metrics.exists():
        return ", before the first logged step"
    return f", {time.time() - metrics.stat().st_mtime:.0f} s after the last logged step"


def _last_checkpoint(workdir: Path) -> str:
    steps = [int(p.name) for p in (workdir / "checkpoints").glob("*") if p.name.isdigit()]
    if not steps:
        return "no checkpoint yet (the rerun starts over)"
    return f"last complete checkpoint {workdir / 'checkpoints' / str(max(steps))}"


def _remove_partial_checkpoints(workdir: Path) -> str:
    """Removes orbax's temporary step directories when no trainer holds the workdir's lock
    (a live peer's save is never touched); says how many."""
    from ibpo_jax.trainer import workdir as workdir_lib  # jax: only now, after the child
    from ibpo_jax.trainer.checkpoint import TMP_SUFFIX

    partial = [p for p in (workdir / "checkpoints").glob(f"*{TMP_SUFFIX}*") if p.is_dir()]
    if not partial:
        return ""
    try:
        lock = workdir_lib.RunLock(workdir).acquire()
    except workdir_lib.WorkdirInUse:
        return ""
    try:
        for tmp in partial:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        lock.release()
    return f" (removed {len(partial)} unfinished save{'s' if len(partial) > 1 else ''})"
