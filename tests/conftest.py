"""Test-wide set-up: 8 fake CPU devices for the sharding tests, a persistent XLA compilation
cache, and a hypothesis profile without deadlines (first calls include XLA compilation)."""

import os
import tempfile

# Must happen before jax is imported anywhere in the test process.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# XLA's persistent compilation cache, shared by the xdist workers and the subprocesses the tests
# start: the trainer's runs compile the same programs again and again (keys are the programs
# themselves, so a hit is the same executable). Measured here: tests/trainer/test_step.py's
# layout tests took 282 s with an empty cache and 49 s on a second run.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"ibpo_jax_tests_xla_cache_{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from hypothesis import HealthCheck, settings  # noqa: E402

from ibpo_jax.runtime import hostmem  # noqa: E402

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


@pytest.fixture
def one_device(monkeypatch):
    """make_mesh over the first data*fsdp*tensor devices of the test process's 8."""
    from tests.trainer import knob_harness

    knob_harness.use_first_devices(monkeypatch)


@pytest.fixture(scope="session")
def plain_smoke_rows(smoke_data_dir, tmp_path_factory):
    """The metrics of the plain `smoke` run (IBPO-GSPO, 4 steps) on one device, run once per
    test process for the tests that compare a knob's run with it."""
    from ibpo_jax.trainer import loop
    from tests.trainer import knob_harness

    with pytest.MonkeyPatch.context() as monkeypatch:
        knob_harness.use_first_devices(monkeypatch)
        return loop.run(knob_harness.smoke_cfg(smoke_data_dir, knob_harness.ONE),
                        workdir=tmp_path_factory.mktemp("plain_smoke"))
