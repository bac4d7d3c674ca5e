"""How the entry points (`ibpo_jax.train`, `ibpo_jax.evaluate`, `ibpo_jax.plan`) end on a
user's mistake: one line on stderr and a non-zero exit code, no traceback.

    @cli.entry_point
    def main(argv: list[str]) -> int: ...

    if __name__ == "__main__":
        sys.exit(main())

A config mistake (a key, a value, an unknown registry name or split, a mesh that does not fit
the devices) prints ``config error: <message>`` and exits 2; any other user error (a file, a
checkpoint, a busy workdir, a sandbox, a multi-process launch that does not start) prints
``error: <message>`` and exits 1. Each message already names its culprit. ``--debug`` or
``IBPO_DEBUG=1`` re-raises instead, with the traceback. Anything else is a bug and keeps its
traceback. A training run stopped by SIGINT / SIGTERM exits 3 (`EXIT_STOPPED`) after its
checkpoint: not an error, it resumes. A process of a multi-process run that lost a peer (or was
itself killed) exits 4 (`trainer.supervisor.EXIT_LOST`) with one line: it resumes too.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence

EXIT_CONFIG = 2
EXIT_USER = 1
EXIT_STOPPED = 3  # stopped on a signal, checkpointed: resumable (ibpo_jax.train)


def config_errors() -> tuple[type[BaseException], ...]:
    """Mistakes in what the config (or the command line) says."""
    from ibpo_jax.config import registry
    from ibpo_jax.config import sections as config_sections
    from ibpo_jax.models import config as model_config

    errors: list[type[BaseException]] = [config_sections.ConfigError,
                                         model_config.ArchitectureError,
                                         registry.UnknownNameError]  # (splits among them)
    sharding = sys.modules.get("ibpo_jax.runtime.sharding")  # imported by then if it raised
    if sharding is not None:
        errors.append(sharding.MeshError)
    chips = sys.modules.get("ibpo_jax.runtime.chips")
    if chips is not None:
        errors.append(chips.UnknownChipError)
    return tuple(errors)


def user_errors() -> tuple[type[BaseException], ...]:
    """Every error an entry point prints as one line: config errors, then the run's own."""
    from ibpo_jax.data.files import DataFormatError
    from ibpo_jax.models.safetensors_io import HFCheckpointError
    from ibpo_jax.trainer.errors import RunError

    errors = [*config_errors(), RunError, DataFormatError, HFCheckpointError, FileNotFoundError]
    for module, name in (("ibpo_jax.rewards.code", "SandboxUnavailable"),
                         ("ibpo_jax.runtime.sharding", "DistributedSetupError")):
        if module in sys.modules:  # only raised once its module is in use
            errors.append(getattr(sys.modules[module], name))
    return tuple(errors)


def debug_requested(argv: Sequence[str] = ()) -> bool:
    """--debug on the command line, or IBPO_DEBUG set to anything but "" / "0"."""
    return "--debug" in argv or os.environ.get("IBPO_DEBUG", "") not in ("", "0")


def report(error: BaseException) -> int:
    """Prints `error` as one line and returns the exit code for it."""
    is_config = isinstance(error, config_errors())
    message = " ".join(str(error).split()) or type(error).__name__  # one line, always
    print(f"{'config error' if is_config else 'error'}: {message}", file=sys.stderr, flush=True)
    return EXIT_CONFIG if is_config else EXIT_USER


def entry_point(main: Callable[[list[str]], int]) -> Callable[[Sequence[str] | None], int]:
    """`main(argv) -> exit code`, its user errors printed as one line (module docstring);
    the wrapped function takes argv=None for sys.argv[1:]."""

    @functools.wraps(main)
    def wrapped(argv: Sequence[str] | None = None) -> int:
        argv = list(sys.argv[1:] if argv is None else argv)
        try:
            return main(argv)
        except Exception as e:
            if not isinstance(e, user_errors()) or debug_requested(argv):
                raise
            return report(e)

    return wrapped
