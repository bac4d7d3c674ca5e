"""Sandboxes run as one shared uid (65534 for a root trainer), and without a user namespace
RLIMIT_NPROC counts every task of that uid. A test that measures the limit exactly must not
share the uid with another xdist worker's sandbox, whose tasks come and go around the count
the harness takes: those tests hold an exclusive lock, every other test here a shared one."""

import fcntl
import os
import tempfile

import pytest

LOCK = os.path.join(tempfile.gettempdir(), "ibpo_jax_tests_sandbox_uid.lock")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "sole_sandbox: no other test's sandbox runs under the shared uid meanwhile")


@pytest.fixture(autouse=True)
def _sandbox_uid_lock(request):
    exclusive = request.node.get_closest_marker("sole_sandbox") is not None
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
