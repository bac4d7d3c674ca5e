"""Back-fill the code that made each committed record (issue 42): `commit`, `dirty`,
`commit_source` and `cpu`, for records written before reproduce.py / the probes recorded them.

    python -m experiments.reports.provenance [RECORDS_DIR ...]
        (default: experiments/results/runs/*)

A record's measured values were first committed by some commit O: the oldest of the newest
unbroken line of versions of the file whose measured values equal the current ones (a later
commit that only cut rows, e.g. the `truncated` 300-step records, or added fields does not
count; a re-measured record that replaced an older file does). The code that made it is at best
O's parent (the run finished before O was made, from a tree at or after the parent, maybe with
uncommitted changes): recorded as `"commit": "<parent>", "dirty": null, "commit_source":
"backfilled: parent of <O>, the commit that added this record's values"`, or "unknown" when
the file is not committed. `cpu` stays the record's own; otherwise it is the host that O's
message names as where the record ran (`HOSTS`), else "unknown". Only fields are added: the
measured values are never touched (checked before writing).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADDED = ("commit", "dirty", "commit_source", "cpu")
NOT_MEASURED = (*ADDED, "truncated")
# A message names the host a record ran on only as "on <host>" / "<host> host" (a message
# that says "legacy Intel base" names a base, not where the record ran).
HOSTS = re.compile(r"\b(?:on an? |on )(AMD EPYC|Intel Xeon)\b|\b(AMD EPYC|Intel Xeon) host\b")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def measured(rec: dict, *, last_step: int | None = None) -> dict:
    """The record's measured values: without provenance fields, rows cut at `last_step`."""
    out = {k: v for k, v in rec.items() if k not in NOT_MEASURED}
    if last_step is not None and "rows" in out:
        out["rows"] = [r for r in out["rows"] if r.get("step", 0) <= last_step]
    return out


def origin(path: Path, rec: dict) -> str | None:
    """The commit that first committed `rec`'s measured values at `path` (None if none)."""
    rel = path.resolve().relative_to(ROOT).as_posix()
    last = max((r.get("step", 0) for r in rec.get("rows", [])), default=None)
    now, found = measured(rec, last_step=last), None
    for commit in _git("log", "--format=%H", "--", rel).split():
        try:
            old = json.loads(_git("show", f"{commit}:{rel}"))
        except (subprocess.CalledProcessError, json.JSONDecodeError):  # deleted there
            break
        if measured(old, last_step=last) != now:
            break
        found = commit
    return found


def host_named(commit: str) -> str:
    """The host the commit's message says its records ran on, or "unknown"."""
    named = {a or b for a, b in HOSTS.findall(_git("log", "-1", "--format=%B", commit))}
    return named.pop() if len(named) == 1 else "unknown"


def backfill(rec: dict, *, path: Path) -> dict:
    """`rec` with the provenance fields it lacks (see the module docstring)."""
    if "commit" in rec and "cpu" in rec:
        return rec
    out = dict(rec)
    first = origin(path, rec)
    if "commit" not in rec:
        if first is None:
            out.update(commit="unknown", dirty=None,
                       commit_source="unknown: the record is not committed")
        else:
            parents = _git("log", "-1", "--format=%P", first).split()
            out.update(commit=parents[0] if parents else "unknown", dirty=None,
                       commit_source=f"backfilled: parent of {first[:12]}, the commit that "
                       "added this record's values")
    if "cpu" not in rec:
        out["cpu"] = host_named(first) if first else "unknown"
    assert measured(out) == measured(rec)  # never a measured value changed
    return out


def main(argv: list[str] | None = None) -> int:
    dirs = [Path(a) for a in (argv if argv is not None else sys.argv[1:])] or sorted(
        (ROOT / "experiments" / "results" / "runs").glob("*"))
    for d in dirs:
        for path in sorted(d.glob("*.json")):
            text = path.read_text()
            rec = json.loads(text)
            new = backfill(rec, path=path)
            if new is rec:
                continue
            # The writer's own layout (trainer records compact, probe records json.dumps'),
            # so the diff is the added fields alone.
            compact = json.dumps(rec, separators=(",", ":")) + "\n" == text
            path.write_text(json.dumps(new, separators=(",", ":") if compact else None) + "\n")
            print(f"{path.relative_to(ROOT)}: commit {new['commit'][:12]}, cpu {new['cpu']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
