"""The lost-peer line of a multi-process run (trainer/supervisor.py) from the runtime's own
logs as jaxlib writes them; the whole path (two processes, one killed) runs in
tests/trainer/test_loop.py."""

import signal
import sys

from ibpo_jax.trainer import supervisor

_MARK = "ibpo: process 0 of 2\n"
_UNHEALTHY = ("E1207 05:07:26.064733 27472 coordination_service.cc:1549] Use error polling to "
              "propagate the following error to all tasks: UNAVAILABLE: The following tasks "
              "are unhealthy (stopped sending heartbeats):\n1\nThe tasks have crashed.\n"
              "*** Check failure stack trace: ***\n    @     0x7fe6d6240634  absl::Flush()\n")
_BARRIER = ("Barrier result: 'INTERNAL: Barrier failed because: task is set to ERROR: "
            "UNAVAILABLE: Task 1 heartbeat timeout. This indicates that the remote task has "
            "failed'\n")
_COORDINATOR = ("W1207 05:08:03.178794 27944 preemption_sync_manager.cc:147] Failed to retrieve "
                "preemption notice from coordination service: UNAVAILABLE: Socket closed\n")
_GLOO = ("jax.errors.JaxRuntimeError: UNKNOWN: Gloo AllGather failed: [pair.cc:538] Read error "
         "[127.0.0.1]:7084: Connection reset by peer\n")


def test_the_lost_process_is_named_from_either_heartbeat_message():
    for log in (_UNHEALTHY, _BARRIER, _GLOO + _BARRIER):
        assert supervisor.diagnose(_MARK + log, -signal.SIGABRT, 60) == (
            "lost process 1 of 2: no heartbeat within train.heartbeat_s=60 s (this is process 0)")
    three = _MARK.replace("of 2", "of 3") + _UNHEALTHY.replace(":\n1\n", ":\n1,2\n")
    assert supervisor.diagnose(three, -6, 9).startswith("lost processes 1, 2 of 3: ")


def test_a_lost_coordinator_a_closed_collective_and_a_kill_are_told_apart():
    one = "ibpo: process 1 of 2\n"
    assert supervisor.diagnose(one + _COORDINATOR, -6, 60) == (
        "lost process 0 of 2, the coordinator: its connection closed (this is process 1)")
    assert supervisor.diagnose(_MARK + _COORDINATOR, -6, 60).startswith(
        "the distributed runtime stopped this process (signal SIGABRT)")  # 0 is the coordinator
    assert supervisor.diagnose(one + _GLOO, supervisor.EXIT_LOST, 60) == (
        "lost a peer of 2: a collective's connection closed (this is process 1)")
    connected = "[Gloo] Rank 1 is connected to 1 peer ranks\n"  # chatter, not a failure
    assert supervisor.diagnose(one + connected, -signal.SIGKILL, 60) == (
        "this process (1 of 2) was killed (SIGKILL: the kernel's out-of-memory killer, or "
        "kill -9)")
    assert supervisor.diagnose("", -signal.SIGKILL, 60).startswith("this process was killed")
    assert supervisor.diagnose(one + connected, -signal.SIGSEGV, 60) == (
        "the distributed runtime stopped this process (signal SIGSEGV) (this is process 1)")


def test_a_collective_failure_reads_as_a_peer_and_a_bug_does_not():
    assert supervisor.peer_failure(RuntimeError(_GLOO))
    assert not supervisor.peer_failure(ValueError("operands could not be broadcast together"))


def test_the_child_keeps_python_output_on_the_terminal_and_the_runtime_in_the_log(tmp_path):
    """fd 1 and 2 (what C++ writes) go to the log; print() and sys.stderr still reach the
    process's own output."""
    import subprocess

    log = tmp_path / "runtime.log"
    script = ("import os, sys\nfrom ibpo_jax.trainer import supervisor\n"
              f"supervisor.keep_runtime_output({str(log)!r})\n"
              "os.write(1, b'C++ out\\n'); os.write(2, b'C++ err\\n')\n"
              "print('python out'); print('python err', file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)
    assert (out.stdout, out.stderr) == ("python out\n", "python err\n")
    assert log.read_text() == "C++ out\nC++ err\n"
