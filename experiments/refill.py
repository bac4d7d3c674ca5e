"""Adds to committed run records the per-step metrics today's items keep (`reproduce.kept`)
that a record written before an item asked for them lacks, from the run's own log.

    python -m experiments.refill --task arith WORKDIRS_ROOT [...]

A record `<name>.json` of experiments/results/runs/<task>/ is refilled from
`WORKDIRS_ROOT/<name>/metrics.jsonl` (`reproduce`'s layout: runs/reproduce/<task>/<name>/), the
log the record was compacted from. That is checked first: the workdir's config.json must be the
record's `config` and every step the record has must log the record's values; a workdir that is
not the record's run is named and skipped. Only keys a row lacks are added, for the steps the
record keeps; its measured values, commit and host stay as they are (asserted before writing).
(`recipe`'s share of mixed groups, `frac_groups_all_same`, is logged by every run but was kept
only from that item on.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiments import reproduce
from ibpo_jax.trainer import logs

RECORDS = reproduce.ROOT / "experiments" / "results" / "runs"


def _log(metrics: Path) -> dict[int, dict]:
    """The logged rows of a finished run by step (a torn last line skipped)."""
    rows = {}
    for row in reproduce.log_rows(metrics):
        rows.setdefault(row["step"], {}).update(row)
    return rows


def refill(record: dict, workdir: Path, keys: tuple[str, ...]) -> tuple[dict, str]:
    """(`record` with the `keys` its rows lack taken from `workdir`'s log, why it is
    unchanged: "" when something was added)."""
    cfg, metrics = workdir / "config.json", workdir / "metrics.jsonl"
    if not (cfg.exists() and metrics.exists()):
        return record, "no config.json and metrics.jsonl there"
    try:
        if json.loads(cfg.read_text()) != record["config"]:
            return record, "its config.json is not the record's config"
        log = _log(metrics)
    except (json.JSONDecodeError, KeyError, logs.MetricsFileError) as e:
        return record, f"its config.json or metrics.jsonl does not read ({e!r})"
    for row in record["rows"]:
        logged = log.get(row["step"], {})
        if any(logged.get(k) != v for k, v in row.items()):
            return record, f"its log differs from the record at step {row['step']}"
    rows = [{**row, **{k: log[row["step"]][k] for k in keys
                       if k not in row and k in log[row["step"]]}} for row in record["rows"]]
    if rows == record["rows"]:
        return record, "nothing to add"
    assert all(new[k] == v for new, old in zip(rows, record["rows"]) for k, v in old.items())
    return {**record, "rows": rows}, ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, choices=sorted(reproduce.TASKS))
    p.add_argument("roots", nargs="+", type=Path, help="directories holding the runs' workdirs")
    p.add_argument("--records", type=Path, default=RECORDS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    keys = reproduce.kept()
    for path in sorted((args.records / args.task).glob("*.json")):
        record = json.loads(path.read_text())
        if "rows" not in record:  # a probe's record, not a training run's
            continue
        for root in args.roots:
            workdir = root / path.stem
            if not workdir.is_dir():
                continue
            new, why = refill(record, workdir, keys)
            if why:
                print(f"{path.name}: {workdir}: {why}", file=sys.stderr)
                continue
            added = sorted({k for row in new["rows"] for k in row} - {
                k for row in record["rows"] for k in row})
            reproduce.write_record(path, new)
            print(f"{path.name}: added {', '.join(added) or 'values of known keys'} "
                  f"from {workdir}")
            break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
