"""Reproduce the papers' tables and figures in miniature, with one command.

    python -m experiments.reproduce ITEM [--task arith|arith_long] [--seeds N] [--jobs J] [--smoke]
                                         [--out DIR] [--only LABEL,...] [--report-only]
                                         [--rerun LABEL:SEED]

ITEM is an item of `ITEMS` (experiments/items_registry.py; `--help` lists them), several of
them joined by commas (their runs train as one pool, `--jobs` at a time), or `all`. The driver
knows no item by name: what an item trains, keeps, judges and adds to its page is its entry in
`ITEMS`.

Each training run goes to runs/reproduce/<task>/<run name>_s<seed>/ (the trainer's own
workdir: a killed run resumes from its last checkpoint). When a run finishes, its compact
record (config, the per-step rows of the keys the reports use, the command) is written to
experiments/results/runs/<task>/<run name>_s<seed>.json: commit those. A run whose record
exists is not trained again, so a fresh machine with the committed records rebuilds every
table without rerunning anything, and an interrupted grid picks up where it stopped. Reports
(experiments/results/<task>/<item>.md and PNGs, and the summary experiments/results/README.md)
are aggregated from the records only, every seed recorded for a run (C.3's G = 8 is C.2's
GSPO and has C.2's seeds), so a report is the same after training as with `--report-only`,
and names the command that trains its item's runs. `--only` trains just the runs with those
labels (the report still reads every record); a run that another driver is training is left
to it.
`--report-only` trains nothing and reports the records there are (a grid stopped midway: the
tables say how many seeds each row has). `--rerun LABEL:SEED` (a paired item) trains one
recorded seed again at this commit and keeps it beside the records: where it reproduces its
record exactly, that run's records pair with arms trained at this commit
(experiments/reports/reuse.py). Verdicts follow one rule for every item
(experiments/reports/stats.py, stated in experiments/results/README.md); records name the code that
made them (`commit`, `dirty`; older ones back-filled by `python -m experiments.reports.provenance`).

--smoke trains the `smoke` preset for one step, one seed, the first run of each item (or the
runs its `smoke` names), into --out (a temporary directory by default): seconds per run, for
the test suite.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from experiments import items as items_lib
from experiments import items_registry
from experiments.host import cpu_model, git_commit
from experiments.reports import report, summary
from ibpo_jax.trainer import logs

ROOT = items_lib.ROOT
RESULTS = ROOT / "experiments" / "results"
# The per-step keys every record keeps, whatever its items read: the evaluations, the steps
# (rows with only a step are dropped), the budget a run stops at and the diagnostic steps'
# marker (`compact`), and the minutes per run (`report.run_minutes`). A record keeps these,
# the training curves and every item's metrics (`kept`).
ALWAYS_KEPT = ("step", "eval_accuracy", "budget_trajectories", "pg_var", "time_total_s")


def kept() -> tuple[str, ...]:
    """The keys a record keeps of each logged step."""
    return items_lib.kept(ALWAYS_KEPT, items_registry.ITEMS.values())


# Every run starts from its preset's base committed in experiments/warm_starts/ (the trainer
# finds it, `policy.warm_start_dir`): the same code and config warm-start `arith_long` to a base
# that solves 33.4 % on an Intel Xeon and 23.9 % on an AMD EPYC (floating point differs by
# host), and runs on different bases do not compare. Records name their base (`base`:
# directory and the weights' sha256) and their host's CPU.
TASKS = {  # --task -> (preset, extra overrides)
    "arith": ("arith_tiny", ()),
    "arith_long": ("arith_long", ()),  # 8-step chains (README "The long task")
    "countdown": ("countdown", ()),  # several right solutions per problem (issue #48)
}


def command(r: items_lib.Run, *, task: str, preset: str, seed: int, workdir: Path,
            extra: tuple[tuple[str, str], ...] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "ibpo_jax.train", f"--config=configs/{r.algo}.py:{preset}",
           f"--workdir={workdir}", f"--config.seed={seed}", "--config.train.progress=false"]
    cmd += [f"--config.{k}={v}" for k, v in (*r.overrides_on(task), *extra)]
    return cmd


def log_rows(metrics: Path) -> list[dict]:
    """A run's logged rows in order (`logs.read_metrics`; the torn last line of a run still
    writing is dropped quietly: such a run is unfinished and gets no record)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return logs.read_metrics(metrics)


def compact(workdir: Path, cmd: list[str]) -> dict | None:
    """The run's record, or None when it has not finished (no final evaluation)."""
    cfg_path, metrics = workdir / "config.json", workdir / "metrics.jsonl"
    if not (cfg_path.exists() and metrics.exists()):
        return None
    cfg = json.loads(cfg_path.read_text())
    keys = kept()
    rows = [r for r in ({k: row[k] for k in keys if k in row} for row in log_rows(metrics))
            if len(r) > 1]
    budget = cfg["train"].get("budget", 0)
    last = [r for r in rows if "eval_accuracy" in r and (
        r["step"] == cfg["train"]["steps"]
        or 0 < budget <= r.get("budget_trajectories", 0))]  # stopped at the budget
    if not last:
        return None
    # A few KB per run: evaluations, diagnostic steps and every 10th step.
    rows = [r for r in rows if r["step"] % 10 == 0 or "eval_accuracy" in r or "pg_var" in r]
    base = workdir / "base.json"
    commit, dirty = git_commit(ROOT)
    return {"command": " ".join(cmd[1:]).replace(sys.executable, "python"), "config": cfg,
            "commit": commit, "dirty": dirty,
            "base": json.loads(base.read_text()) if base.exists() else None,
            "cpu": cpu_model(), "rows": rows}


BUSY = "being trained by another driver"


def _train(job: tuple[list[str], Path, Path]) -> tuple[Path, float, str]:
    cmd, workdir, log_path = job
    t0 = time.time()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # One trainer per workdir: a second driver (another item sharing the run, or --only)
    # leaves a run that one is training alone instead of resuming it concurrently.
    with open(log_path.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return workdir, 0.0, BUSY
        if compact(workdir, cmd) is not None:  # another driver finished it while we queued
            return workdir, 0.0, ""
        with open(log_path, "a") as log:
            proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                  env=_env(workdir.parent))
    err = "" if proc.returncode == 0 else f"exit {proc.returncode}, see {log_path}"
    return workdir, time.time() - t0, err


def _env(runs_dir: Path) -> dict[str, str]:
    """The trainers' environment: a persistent XLA compilation cache shared by the grid's runs
    (the same programs at the same shapes; about 17 s less compiling per `arith` run, the
    metrics bit for bit the same), unless the caller chose one."""
    return {"JAX_COMPILATION_CACHE_DIR": str(runs_dir / "xla_cache"), **os.environ}


def ensure_runs(jobs: list[tuple[items_lib.Run, int]], *, task: str, preset: str,
                extra: tuple, runs_dir: Path, records_dir: Path, parallel: int) -> None:
    """Trains the runs without a record (resuming any partial workdir), `parallel` at a time,
    writing each record as its run finishes."""
    todo, by_workdir = [], {}
    for r, seed in jobs:
        record = records_dir / f"{r.name}_s{seed}.json"
        if record.exists():
            continue
        workdir = runs_dir / f"{r.name}_s{seed}"
        cmd = command(r, task=task, preset=preset, seed=seed, workdir=workdir, extra=extra)
        if (rec := compact(workdir, cmd)) is not None:  # finished, record not yet written
            write_record(record, rec)
            continue
        todo.append((cmd, workdir, runs_dir / "logs" / f"{r.name}_s{seed}.log"))
        # A resumed run takes a fraction of a whole one: it does not set the pace.
        by_workdir[workdir] = (record, cmd, not any((workdir / "checkpoints").glob("*")))
    if not todo:
        return
    print(f"[{task}] {len(todo)} run(s) to train, {parallel} at a time", flush=True)
    done, whole = 0, []  # minutes of each run trained from its first step
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        # Recorded as each finishes (workdirs are not committed; a stopped session keeps these).
        futures = [pool.submit(_train, job) for job in todo]
        for future in concurrent.futures.as_completed(futures):
            workdir, seconds, err = future.result()
            done += 1
            record, cmd, fresh = by_workdir[workdir]
            rec = compact(workdir, cmd)
            if err == BUSY:
                print(f"  [{done}/{len(todo)}] {workdir.name}: skipped ({err})", flush=True)
                continue
            if err or rec is None:
                print(f"  [{done}/{len(todo)}] {workdir.name}: FAILED ({err or 'no final eval'})",
                      flush=True)
                continue
            write_record(record, rec)
            whole += [seconds / 60] if fresh else []
            pace = sum(whole) / len(whole) / parallel if whole else 0.0  # min a run, wall
            left = (f"; the rest in about {pace * (len(todo) - done):.0f} min"
                    if pace and done < len(todo) else "")
            print(f"  [{done}/{len(todo)}] {workdir.name}: {seconds / 60:.1f} min"
                  f"{'' if fresh else ' (resumed)'}, final eval "
                  f"{rec['rows'][-1]['eval_accuracy']:.3f}{left}", flush=True)


def write_record(path: Path, record: dict) -> None:
    """Writes a run's record atomically (a reader never sees half of it), compact JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def _recorded_seeds(records_dir: Path, run: items_lib.Run) -> int:
    """1 + the highest seed recorded for `run` (0 when none is)."""
    seeds = [int(p.stem.rpartition("_s")[2])
             for p in records_dir.glob(f"{glob.escape(run.name)}_s*.json")
             if p.stem.rpartition("_s")[2].isdigit()]
    return 1 + max(seeds, default=-1)


def _preset(task: str, smoke: bool) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The config preset and overrides of the task's trainers."""
    if smoke:  # the smoke preset's batch whatever the item sets (e.g. C.3's prompts per step)
        # (and the plain smoke base: a second warm start would only cost the tests time).
        return "smoke", (("train.steps", "1"), ("train.eval_every", "1"),
                         ("rollout.prompts_per_step", "4"), ("warm_start.followups", "false"))
    return TASKS[task]


def _seeds_and_command(item: items_lib.Item, runs: tuple[items_lib.Run, ...], n_seeds: int, *,
                       task: str, seeds: int | None, smoke: bool, train: bool,
                       records_dir: Path) -> tuple[int, str]:
    """The seeds the item's report reads, and the command that reproduces it."""
    cmd_seeds = n_seeds
    if not smoke and (train or not seeds):  # `--report-only --seeds N` reads N seeds;
        # otherwise a report reads every seed recorded for its runs,
        recorded = [_recorded_seeds(records_dir, r) for r in runs]
        n_seeds = max([n_seeds, *recorded])
        # and names the command that trains them: a run shared with an item of more
        # seeds (C.3's G = 8 is C.2's GSPO) has more than this item's command trains.
        cmd_seeds = max(cmd_seeds, min((n for r, n in zip(runs, recorded)
                                        if not r.max_seeds), default=0))
    cmd = f"python -m experiments.reproduce {item.name} --task {task}" + (
        f" --seeds {cmd_seeds}" if cmd_seeds != item.min_seeds and not smoke else "") + (
        " --smoke" if smoke else "")
    return n_seeds, cmd


def _report(ctx: items_lib.ProbeContext, runs: tuple[items_lib.Run, ...], why: str
            ) -> list[Path]:
    """The item's page: its probe's, or its runs' report with its sections (nothing under
    --report-only while none of its runs has a record: the summary says "not run yet")."""
    item = ctx.item
    if item.probe is not None and not why:
        return list(item.probe(ctx))
    if not ctx.measure and not any(report.load(ctx.records_dir, r, r.seeds(ctx.seeds))
                                   for r in runs):
        return []
    files = report.write_item(item, runs=runs, seeds=ctx.seeds, records_dir=ctx.records_dir,
                              out_dir=ctx.out_dir, command=ctx.command, missing=why,
                              task=ctx.task)
    for section in () if why else item.sections:
        if lines := section(ctx):
            with open(files[0], "a") as f:
                f.write("\n".join(lines) + "\n")
    return files


PAIRED = "paired"  # the subdirectory of a paired item's records and workdirs


def own(path: Path, paired: bool) -> Path:
    """A paired item's records or workdirs under `path` (`Item.paired`), else `path`."""
    return path / PAIRED if paired else path


def refuse_dirty(paired: list[items_lib.Item]) -> None:
    """A paired item trains from a clean tree only: its records name one commit, and a report
    refuses to pair records of different commits (experiments/reports/paired.py)."""
    commit, dirty = git_commit(ROOT)
    if paired and dirty:
        raise SystemExit(f"{', '.join(i.name for i in paired)}: a paired item trains at one "
                         f"commit from a clean tree; commit or stash the changes to code "
                         f"first (HEAD {commit[:10]}; `git status`), or train it from a "
                         "worktree pinned to its commit")


def rerun(name: str, spec: str, *, task: str, out: Path) -> Path:
    """Trains seed SEED of the paired item's run LABEL again at this commit (`spec`
    "LABEL:SEED"), beside its records (experiments/reports/reuse.py: a rerun that reproduces
    its record exactly lets that run's records pair with arms trained at this commit)."""
    from experiments.reports import reuse

    item = items_registry.ITEMS[name]
    label, _, seed = spec.rpartition(":")
    runs = {r.label: r for r in item.runs_on(task)}
    if not item.paired or label not in runs or not seed.isdigit():
        raise SystemExit(f"--rerun {spec}: give LABEL:SEED of a run of a paired item on "
                         f"--task {task}" + (f"; runs: {', '.join(runs)}" if item.paired
                                             else f"; {name} is not paired"))
    refuse_dirty([item])
    records_dir, preset = own(out / "runs" / task, True), TASKS[task][0]
    if not (records_dir / f"{runs[label].name}_s{seed}.json").exists():
        raise SystemExit(f"--rerun {spec}: no record of it in {records_dir} to reproduce")
    runs_dir = own(ROOT / "runs" / "reproduce" / task, True) / reuse.RERUNS
    # One workdir per commit: an older rerun's checkpoints are never resumed by newer code.
    workdir = runs_dir / f"{runs[label].name}_s{seed}_{git_commit(ROOT)[0][:10]}"
    cmd = command(runs[label], task=task, preset=preset, seed=int(seed), workdir=workdir,
                  extra=TASKS[task][1])
    _, _, err = _train((cmd, workdir, runs_dir / "logs" / f"{workdir.name}.log"))
    if err or (rec := compact(workdir, cmd)) is None:
        raise SystemExit(f"--rerun {spec}: {err or 'no final evaluation'}")
    path = reuse.rerun_path(records_dir, runs[label].name, int(seed), rec["commit"])
    write_record(path, rec)
    return path


def reproduce(names: list[str], *, task: str, seeds: int | None, parallel: int, smoke: bool,
              out: Path, only: tuple[str, ...] = (), train: bool = True) -> list[Path]:
    """Runs and reports `names` (training only the runs labelled `only`, if given; nothing
    without `train`); returns the results files written."""
    preset, extra = _preset(task, smoke)
    chosen = [items_registry.ITEMS[name] for name in names]
    labels = {r.label for item in chosen for r in item.runs}
    if unknown := set(only) - labels:
        raise SystemExit(f"--only {', '.join(sorted(unknown))}: no such run in "
                         f"{', '.join(names)}; runs: {', '.join(sorted(labels))}")
    runs_dir = (out / "workdirs" if smoke else ROOT / "runs" / "reproduce") / task
    records_dir = out / "runs" / task
    plan = [(item, tuple(r for r in (item.smoke_runs if smoke else item.runs) if r.on(task)),
             1 if smoke else (seeds or item.min_seeds), item.missing())  # (item, runs, seeds,
            for item in chosen]  # why not)
    if train and not smoke:
        refuse_dirty([item for item, *_ in plan if item.paired])
    # The items' runs train as one pool (shared runs once), so `parallel` stays busy across
    # items instead of idling at the end of each; probes run after the whole pool.
    jobs = {}  # by (records dir, run, seed): seed-major, so a seed's arms train back to back
    for item, runs, n_seeds, why in plan:
        # Each run's own seeds (a run may ask for more or fewer than its item; --smoke: 1).
        per_run = {r.name: 1 if smoke else r.seeds(n_seeds) for r in runs}
        if not why:
            jobs.update({(item.paired, r.name, s): (r, s)
                         for s in range(max(per_run.values(), default=0)) for r in runs
                         if s < per_run[r.name] and (not only or r.label in only)})
    if train:
        for paired in (False, True):  # a paired item's runs are its own (`Item.paired`)
            ensure_runs([v for k, v in jobs.items() if k[0] == paired], task=task,
                        preset=preset, extra=extra, runs_dir=own(runs_dir, paired),
                        records_dir=own(records_dir, paired), parallel=parallel)
    written = []
    for item, runs, asked, why in plan:
        item_records = own(records_dir, item.paired)
        n_seeds, cmd = _seeds_and_command(item, runs, asked, task=task, seeds=seeds,
                                          smoke=smoke, train=train, records_dir=item_records)
        written += _report(items_lib.ProbeContext(
            item=item, task=task, preset=preset, extra=extra, seeds=n_seeds, asked=asked,
            smoke=smoke, measure=train, records_dir=item_records,
            runs_dir=own(runs_dir, item.paired), out_dir=out / task, command=cmd), runs, why)
    written.append(summary.write_summary(out, tasks=(task,) if smoke else tuple(TASKS)))
    if out == RESULTS and summary.sync_front_page(ROOT / "README.md", out, tuple(TASKS),
                                                  link_prefix="experiments/results/"):
        written.append(ROOT / "README.md")  # its verdict table, from the same reports
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("item", help=f"one of {', '.join(items_registry.ORDER)}, several joined by "
                   "commas (their runs train as one pool), or all")
    p.add_argument("--task", choices=tuple(TASKS), default="arith")
    p.add_argument("--seeds", type=int, default=None, help="seeds to train (default: the "
                   "item's minimum, 2-3); reports read every seed recorded, but with "
                   "--report-only only these")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--only", default="", help="comma-separated run labels to train (e.g. "
                   "'SCoRe+GRPO'); the report still reads every recorded run")
    p.add_argument("--report-only", action="store_true", help="train nothing: write the "
                   "reports from the records there are (a grid stopped midway)")
    p.add_argument("--rerun", default="", metavar="LABEL:SEED", help="a paired item: train "
                   "this seed of this run again at this commit, then report (its old records "
                   "pair with this commit's where the rerun reproduces its record exactly)")
    args = p.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="reproduce-smoke-")) if args.smoke
                       else RESULTS)
    registry = items_registry.ITEMS
    planned = [n for n, item in registry.items() if item.planned(args.task)]
    names = planned if args.item == "all" else args.item.split(",")
    if bad := [n for n in names if n in registry and n not in planned]:
        p.error(f"{', '.join(bad)}: not planned on --task {args.task} (its items: "
                f"{', '.join(planned)})")
    if bad := [n for n in names if n not in registry]:
        p.error(f"unknown item {', '.join(bad)}; valid: {', '.join(registry)}, all")
    if args.rerun and len(names) != 1:
        p.error("--rerun: name one paired item")
    try:
        if args.rerun:
            print(f"wrote {rerun(names[0], args.rerun, task=args.task, out=out)}")
        for path in reproduce(names, task=args.task, seeds=args.seeds, parallel=args.jobs,
                              smoke=args.smoke, out=out,
                              only=tuple(x for x in args.only.split(",") if x),
                              train=not (args.report_only or args.rerun)):
            print(f"wrote {path}")
    except logs.MetricsFileError as e:  # a damaged run log: named, FILE:LINE
        print(f"reproduce: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
