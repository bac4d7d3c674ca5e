"""Test-wide set-up: 8 fake CPU devices for the sharding tests, and a hypothesis profile
without deadlines (first calls include XLA compilation)."""

import os

# Must happen before jax is imported anywhere in the test process.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from hypothesis import HealthCheck, settings  # noqa: E402

from ibpo_jax import hostmem  # noqa: E402

hostmem.reuse_freed_memory()  # as the entry points do: the tests run jitted steps in-process

settings.register_profile(
    "ibpo",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("CI") == "true",  # CI reruns are reproducible
)
settings.load_profile("ibpo")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smoke_data_dir(tmp_path_factory):
    """One data + warm-start directory per test process: the smoke preset's base policy is
    trained once (about 30 s) and shared by every test that runs the trainer."""
    return tmp_path_factory.mktemp("smoke_data")
