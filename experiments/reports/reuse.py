"""When a paired item may reuse records of an older commit (issue 57, deliverable 3).

A paired comparison reads seed s of two arms trained on one host at one commit. An arm added
later trains at a newer commit; its partners' records may stand for that commit only where a
rerun of one of their seeds there, on the same host, reproduces its record exactly: the same
config and base, and every logged value of every row bit for bit (wall-clock fields aside).
Such a rerun is made by `python -m experiments.reproduce ITEM --task T --rerun LABEL:SEED`
and kept beside the records, in runs/<task>/paired/reruns/<run name>_s<seed>_<commit>.json.
Options added to the config since the old commit are the new code's defaults (the command is
the same), so only the old record's options are compared.

A reproduction carries every record of that run made at the old commit on that host (the same
program on the same machine: the seed that was rerun stands for the others); a rerun that
differs carries nothing, and the page says where it first differs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RERUNS = "reruns"  # the subdirectory of a paired item's records holding its reruns
CLOCK = "time_"  # wall-clock fields: a rerun never repeats them


def rerun_path(records_dir: Path, name: str, seed: int, commit: str) -> Path:
    return records_dir / RERUNS / f"{name}_s{seed}_{commit[:10]}.json"


def _leaves(tree: Any, path: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {path: tree}
    return {k: v for key, sub in tree.items()
            for k, v in _leaves(sub, f"{path}.{key}" if path else key).items()}


def _command(rec: dict) -> list[str]:
    return [a for a in str(rec.get("command", "")).split() if not a.startswith("--workdir=")]


def differs(old: dict, new: dict) -> tuple[int, str]:
    """(values compared, where `new` first differs from `old`; "" when it reproduces it).
    The same command (its workdir aside) and base, every config option of the old record at
    its value (an option added since is the new code's default: the command sets none), and
    every logged value bit for bit."""
    if _command(old) != _command(new):
        return 0, "its command differs"
    if old.get("base") != new.get("base"):
        return 0, "its base differs"
    now = _leaves(new.get("config") or {})
    for key, value in _leaves(old.get("config") or {}).items():
        if key not in now or now[key] != value:
            return 0, f"its config differs at {key}: {now.get(key, 'no such option')!r}, " \
                      f"not {value!r}"
    if len(old["rows"]) != len(new["rows"]):
        return 0, f"{len(new['rows'])} logged rows, not {len(old['rows'])}"
    n = 0
    for a, b in zip(old["rows"], new["rows"]):
        keys = sorted(k for k in a.keys() | b.keys() if not k.startswith(CLOCK))
        for k in keys:
            if a.get(k) != b.get(k):
                return n, f"step {a.get('step')}, {k}: {b.get(k)!r}, not {a.get(k)!r}"
        n += len(keys)
    return n, ""


def reruns(records_dir: Path, names: dict[str, str]) -> dict[str, list[tuple[int, dict]]]:
    """label -> [(seed, rerun record)] of the runs named `names` (label -> run name)."""
    out: dict[str, list[tuple[int, dict]]] = {}
    for label, name in names.items():
        for path in sorted((records_dir / RERUNS).glob(f"{name}_s*_*.json")):
            seed = path.stem[len(name) + 2:].partition("_")[0]
            if path.stem.startswith(f"{name}_s") and seed.isdigit():
                out.setdefault(label, []).append((int(seed), json.loads(path.read_text())))
    return out


def _short(rec: dict) -> str:
    return str(rec.get("commit", "unknown"))[:10]


def carried(data: dict[str, dict[int, dict]], found: dict[str, list[tuple[int, dict]]]
            ) -> tuple[dict[str, dict[int, frozenset[str]]], list[str]]:
    """(label -> seed -> the commits a record stands for: its own, and every commit where a
    clean rerun on its host reproduces a record of its run, commit and host exactly; one
    sentence per rerun, saying what it carries or where it differs)."""
    commits = {label: {s: {_short(rec)} for s, rec in recs.items()}
               for label, recs in data.items()}
    said = []
    for label, items in found.items():
        for seed, new in items:
            old = data.get(label, {}).get(seed)
            where = f"{label}'s seed {seed} rerun at {_short(new)} on {new.get('cpu')}"
            if old is None:
                said.append(f"{where}: no record of that seed to reproduce")
                continue
            if new.get("dirty") is not False or new.get("cpu") != old.get("cpu"):
                said.append(f"{where}: not a clean rerun on its record's host "
                            f"({old.get('cpu')}), so it carries nothing")
                continue
            n, diff = differs(old, new)
            if diff:
                said.append(f"{where} differs from its record at {_short(old)} ({diff}), "
                            "so it carries nothing")
                continue
            moved = [s for s, rec in data[label].items()
                     if _short(rec) == _short(old) and rec.get("cpu") == old.get("cpu")]
            for s in moved:
                commits[label][s].add(_short(new))
            said.append(f"{where} reproduces its record at {_short(old)} exactly ({n} logged "
                        f"values): its {len(moved)} records of {_short(old)} on that host "
                        f"stand for {_short(new)}")
    return {k: {s: frozenset(v) for s, v in d.items()} for k, d in commits.items()}, said
