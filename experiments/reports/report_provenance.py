"""What a report says of where its records come from: whether they share their base policy,
the code (commits) and hosts that made them, truncated records, and the runs and comparisons
an item shares with other items (experiments/reports/report.py writes these under each table)."""

from __future__ import annotations

import collections
import json

from experiments import items as items_lib
from experiments import items_registry


def mixed_bases(data: dict[str, list[dict]]) -> str:
    """Why the records do not share their bases, or "". A base's `source` names the config
    that warm-starts it (C.1's two sizes have two, by design); one source warm-started on
    two hosts gives two sets of weights (two sha256), and a run's seeds must share one."""
    weights: dict[str, set[str]] = {}
    for label, recs in data.items():
        if len(bases := {json.dumps(r.get("base"), sort_keys=True) for r in recs}) > 1:
            return f"the seeds of {label} start from {len(bases)} different base policies " \
                f"({', '.join(sorted(bases))})"
        for r in recs:
            base = r.get("base") or {}
            weights.setdefault(base.get("source", "?"), set()).add(base.get("sha256", "?"))
    return next((f"base {src} has {len(shas)} different sets of weights "
                 f"(sha256 {', '.join(sorted(shas))})"
                 for src, shas in sorted(weights.items()) if len(shas) > 1), "")


def hosts(data: dict[str, list[dict]]) -> str:
    """The CPUs the records ran on, with how many records each: minutes per run (and the
    last bits of floating point) depend on the host."""
    counts = collections.Counter(r.get("cpu") or "unknown" for recs in data.values()
                                 for r in recs)
    return "; ".join(f"{cpu} ({n} run{'s' if n > 1 else ''})"
                     for cpu, n in sorted(counts.items()))


def shared_runs(item: items_lib.Item, task: str = "") -> list[str]:
    """Which of the item's runs other items reuse (the same directory and records), and which
    of its comparisons other items count too: their verdicts are not independent evidence.
    Only items planned on `task` count ("": every item)."""
    if item.paired:  # its runs are its own (`Item.paired`)
        return []
    others = [o for o in items_registry.ITEMS.values()
              if o.name != item.name and not o.paired and (not task or o.planned(task))]
    lines = []
    for r in item.runs:
        if users := [o.name for o in others if r.name in {x.name for x in o.runs}]:
            lines.append(f"{r.label} (`{r.name}`) is also a run of {', '.join(users)}")

    def key(it: items_lib.Item, c: items_lib.Comparison) -> tuple:
        names = {x.label: x.name for x in it.runs}
        return (c.ref, c.expect, *sorted((k, names[label], m) for k, label, m in c.terms))

    for c in item.comparisons:
        if users := [o.name for o in others if key(item, c) in {key(o, x) for x in o.comparisons}]:
            lines.append(f"the comparison {c.name} on the same records is counted in "
                         f"{', '.join(users)} too")
    return lines


def code_versions(data: dict[str, list[dict]]) -> str:
    """The commits whose code made the records, with how many records each (a backfilled
    commit is the parent of the commit that added the record:
    `experiments/reports/provenance.py`)."""
    n = collections.Counter()
    for recs in data.values():
        for r in recs:
            commit = str(r.get("commit") or "unknown")
            tag = commit[:10] + (" dirty" if r.get("dirty") else "") + (
                " backfilled" if str(r.get("commit_source", "")).startswith("backfilled") else "")
            n[tag] += 1
    return "; ".join(f"{c} ({k} record{'s' if k > 1 else ''})" for c, k in sorted(n.items()))


TRAINER_CODE = ("ibpo_jax", "configs")  # what a run's numbers depend on, tests aside


def code_changes(commits: set[str]) -> str:
    """Whether the trainer's code changed between the records' commits: the files under
    TRAINER_CODE that differ between the oldest and the newest of them ("" for one commit,
    or without git). A changed file need not change the numbers; an unchanged tree cannot."""
    import subprocess

    known = sorted(c for c in commits if c and c != "unknown")
    if len(known) < 2:
        return ""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=items_lib.ROOT, capture_output=True,
                              text=True, check=True, timeout=30).stdout

    try:
        dated = sorted((int(git("log", "-1", "--format=%ct", c)), c) for c in known)
        files = git("diff", "--name-only", dated[0][1], dated[-1][1], "--",
                    *TRAINER_CODE).split()
    except (OSError, subprocess.SubprocessError):
        return f"The records come from {len(known)} commits (not compared: no git history)."
    unknown = " (plus records of unknown code)" if len(known) < len(commits) else ""
    where = ", ".join(d + "/" for d in TRAINER_CODE)
    listed = ", ".join(f"`{f}`" for f in files[:8]) + (", …" if len(files) > 8 else "")
    change = (f"{len(files)} file(s) of the trainer's code ({where}) changed, so the runs may "
              f"differ by more than their seeds: {listed}" if files
              else "the trainer's code did not change")
    return (f"The records come from {len(known)} commits{unknown}; between the oldest "
            f"({dated[0][1][:10]}) and the newest ({dated[-1][1][:10]}) {change}.")


def truncated(data: dict[str, list[dict]]) -> list[str]:
    """The records whose rows were cut after the run (their `truncated` note)."""
    return [f"{label} seed {_seed(r)}: {r['truncated']}" for label, recs in data.items()
            for r in recs if r.get("truncated")]


def _seed(rec: dict) -> str:
    return str((rec.get("config") or {}).get("seed", "?"))


def final_accuracy(rec: dict) -> float:
    """A run record's last held-out accuracy (its final evaluation)."""
    return [row["eval_accuracy"] for row in rec["rows"] if "eval_accuracy" in row][-1]


def host_split(item: items_lib.Item, data: dict[str, list[dict]]) -> list[str]:
    """Each comparison of two runs' final accuracy whose records come from more than one host
    (issue 57): its effect within each host's seeds (Welch) and, for two hosts, whether they
    disagree (the difference of the two effects, Welch): a pooled "level" may average two
    groups that contradict each other."""
    from experiments.reports import stats  # (scipy: only where a report asks)

    host = lambda r: r.get("cpu") or "unknown"  # noqa: E731
    out = []
    for c in item.comparisons:
        if len(c.terms) != 2 or any(m != "final" for _, _, m in c.terms) or c.ref:
            continue
        (ka, a, _), (kb, b, _) = c.terms
        groups = sorted(set.intersection(*({host(r) for r in data.get(label, [])}
                                           for label in (a, b))))  # hosts with both runs
        if len(groups) < 2:
            continue
        sides, parts = [], []
        for g in groups:
            xa, xb = ([r for r in data.get(label, []) if host(r) == g] for label in (a, b))
            seeds = sorted({int(r.get("config", {}).get("seed", -1)) for r in xa + xb})
            commits = sorted({str(r.get("commit", "?"))[:7] for r in xa + xb})
            t = stats.contrast(terms=[(ka, [final_accuracy(r) for r in xa]),
                                      (kb, [final_accuracy(r) for r in xb])])
            sides.append((xa, xb))
            effect = ("—" if t.diff != t.diff else f"{100 * t.diff:+.2f} points" + (
                "" if t.low != t.low else f" [{100 * t.low:+.2f}, {100 * t.high:+.2f}]"))
            parts.append(f"{g} (seeds {', '.join(map(str, seeds))}; commits "
                         f"{', '.join(commits)}): {effect}")
        line = f"- {c.name}: " + "; ".join(parts)
        if len(sides) == 2:
            (a1, b1), (a2, b2) = sides
            t = stats.contrast(terms=[(ka, [final_accuracy(r) for r in a1]),
                                      (kb, [final_accuracy(r) for r in b1]),
                                      (-ka, [final_accuracy(r) for r in a2]),
                                      (-kb, [final_accuracy(r) for r in b2])])
            if t.p == t.p:
                line += (f"; the two hosts' effects differ by {100 * t.diff:+.2f} points "
                         f"(Welch p {t.p:.2g})")
        out.append(line)
    if not out:
        return []
    return ["", "Where a comparison's records span hosts (and the commits within each), its "
            "effect on each host's seeds alone, Welch 95 % intervals:", "", *out]


def provenance_lines(item: items_lib.Item, data: dict[str, list[dict]], task: str = ""
                     ) -> list[str]:
    """The runs shared with other items (planned on `task`), the code and hosts of the
    records, truncations."""
    lines = []
    if shared := shared_runs(item, task):
        lines += ["", "Shared with other items: " + "; ".join(shared) + "."]
    lines += ["", f"Code (commit of each record): {code_versions(data)}."]
    if changed := code_changes({r.get("commit", "") for recs in data.values() for r in recs}):
        lines += [changed]
    if cut := truncated(data):
        lines += ["", "Truncated records: " + "; ".join(cut) + "."]
    if host_list := hosts(data):
        lines += ["", f"Hosts: {host_list}."]
    return lines + host_split(item, data)
