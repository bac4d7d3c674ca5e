"""Main job: ``python -m ibpo_jax.train --config=configs/ibpo_gspo.py[:preset] [--workdir=DIR]
[--config.key=value ...]``.

With no other argument it runs the embedded default (the `arith` task and a tiny Qwen3, warm
started from nothing); a ``qwen3_*_math`` preset plus ``--config.model.checkpoint=/path`` and
``--config.task.path=/data.jsonl`` runs the paper's setting. A workdir that holds checkpoints is
resumed from the latest. SIGINT / SIGTERM (Ctrl-C, a scheduler's preemption) finish the
current step, checkpoint it and exit with code 3 (`cli.EXIT_STOPPED`) and one line giving the
command that resumes; a second signal exits at once. A multi-process run that loses a process
ends every other one within ``train.heartbeat_s`` with one line and exit code 4
(``ibpo_jax.trainer.supervisor``). The loop itself lives in ``ibpo_jax.trainer.loop``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import traceback

from ibpo_jax import config
from ibpo_jax.trainer import cli


def parse(argv: list[str]) -> tuple[argparse.Namespace, config.RunConfig]:
    parser = argparse.ArgumentParser(prog="python -m ibpo_jax.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/ibpo_gspo.py",
                        help="config file, optionally with :preset")
    parser.add_argument("--workdir", default="", help="outputs + checkpoints "
                        "(default: workdirs/<algo>_<preset>_seed<seed>)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (file, preset, overrides), each key "
                        "with its documentation, and exit")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (also: IBPO_DEBUG=1)")
    args, rest = parser.parse_known_args(argv)
    cfg = config.load(args.config, config.parse_overrides(rest))
    if not args.workdir:
        args.workdir = f"workdirs/{cfg.algo}_{cfg.preset}_seed{cfg.seed}"
    return args, cfg


@cli.entry_point
def main(argv: list[str]) -> int:
    args, cfg = parse(argv)  # a config error: one line (cli), before jax starts
    if args.print_config:
        from ibpo_jax.config import docs as config_docs

        print("\n".join(config_docs.lines(cfg)))
        return 0
    from ibpo_jax.runtime import hostmem, sharding
    from ibpo_jax.trainer import supervisor, workdir

    multi = sharding.distributed_requested(cfg.train.distributed)
    if not multi:
        # A probe: a busy workdir is refused in a second (loop.run holds the lock for the run;
        # a multi-process run's lock is process 0's, known only once jax.distributed is up).
        workdir.RunLock(args.workdir).acquire().release()
    elif supervisor.ENV not in os.environ:  # the watchman of a lost peer (its docstring)
        return supervisor.supervise(argv, workdir=args.workdir,
                                    heartbeat_s=cfg.train.heartbeat_s,
                                    resume=resume_command(argv, args.workdir))
    else:
        supervisor.keep_runtime_output(os.environ[supervisor.ENV])
    hostmem.reuse_freed_memory()  # CPU runs only; before jax starts its threads
    from ibpo_jax.trainer import loop

    # Multi-host: the coordinator comes from the cluster environment ("auto": when there is
    # one; a single process needs no override).
    if sharding.initialize_distributed(cfg.train.distributed,
                                       heartbeat_timeout_seconds=cfg.train.heartbeat_s):
        import jax

        supervisor.note_process(jax.process_index(), jax.process_count())
    try:
        loop.run(cfg, workdir=args.workdir)
    except workdir.RunStopped as stopped:
        print(f"{stopped}; resume with: {resume_command(argv, args.workdir)}", file=sys.stderr,
              flush=True)
        return cli.EXIT_STOPPED
    except Exception as error:  # a collective that failed with its peer: the watchman says so
        if not (multi and supervisor.peer_failure(error)):
            raise
        with os.fdopen(os.dup(2), "w") as log:  # fd 2: the runtime's log
            traceback.print_exc(file=log)
        supervisor.await_verdict(cfg.train.heartbeat_s)
    return 0


def resume_command(argv: list[str], workdir: str) -> str:
    """The command line that resumes this run: the same arguments, the workdir spelled out."""
    named = any(a == "--workdir" or a.startswith("--workdir=") for a in argv)
    return shlex.join([sys.executable, "-m", "ibpo_jax.train", *argv,
                       *([] if named else [f"--workdir={workdir}"])])


if __name__ == "__main__":
    sys.exit(main())
