"""Tables, verdicts and provenance of the reproduction, from committed run records only.

A record (experiments/reproduce.py) holds a run's config and its per-step rows. For each item
this writes <out>/<task>/<item>.md (mean ± sd over seeds, the paper's number beside ours, each
of the claim's comparisons with its interval and p-values, a verdict from their counts, the
code and hosts that made the records), <item>.png (experiments/plots.py) and <item>.json (the
verdict and its counts, for the summary table).

The rule (experiments/stats.py; stated in experiments/results/README.md): each comparison of
`Item.comparisons` is a Welch test of a contrast of seed means; it goes "higher" / "lower"
only at Holm-adjusted p < 0.05 within its item, else it is "level", shown with the smallest
effect the seed counts detect at 80 % power. An item's verdict counts its comparisons (k go
the paper's way, m against, the rest level) and maps the counts to a word (`verdict_word`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import statistics
from pathlib import Path

from experiments import items as items_lib
from experiments import plots, stats


def load(records_dir: Path, r: items_lib.Run, seeds: int) -> list[dict]:
    out = []
    for s in range(seeds):
        path = records_dir / f"{r.name}_s{s}.json"
        if path.exists():
            out.append(json.loads(path.read_text()))
    return out


def _evals(rec: dict) -> list[tuple[int, float]]:
    return [(row["step"], row["eval_accuracy"]) for row in rec["rows"] if "eval_accuracy" in row]


def fmt(xs: list[float], scale: float = 1.0, digits: int = 1) -> str:
    m, sd = stats.mean_sd(xs)
    if m != m:
        return "—"
    return f"{m * scale:.{digits}f}" + ("" if sd != sd else f" ± {sd * scale:.{digits}f}")


def summarize(recs: list[dict], metrics: tuple[str, ...]) -> dict:
    """Per-seed values of a run: base, final, gain, and each metric's mean over logged steps."""
    out = {"base": [], "final": [], "gain": [], "time_min": [], "early": [], "early_step": []}
    for rec in recs:
        ev = _evals(rec)
        out["base"].append(ev[0][1])
        out["final"].append(ev[-1][1])
        out["gain"].append(ev[-1][1] - ev[0][1])
        step, acc = early(ev)
        out["early"].append(acc)
        out["early_step"].append(step)
        if any("time_total_s" in row for row in rec["rows"]):
            out["time_min"].append(run_minutes(rec["rows"]))
    for k in metrics:
        # The budget spent is the last row's (a cumulative count); the rest, means over steps.
        pick = (lambda v: v[-1]) if k == "budget_trajectories" else statistics.mean
        out[k] = [pick(v) for rec in recs
                  if (v := [row[k] for row in rec["rows"] if k in row and row["step"] > 0])]
    return out


EARLY = 150 / 400  # §4.2: IBPO reaches GSPO's final in 150 of GSPO's 400 steps


def early(ev: list[tuple[int, float]]) -> tuple[int, float]:
    """(step, accuracy) of the last evaluation within EARLY of the run's steps (the first
    after step 0 when none is: evaluations every 50 of 200 steps put it at step 50, 25 %)."""
    within = [(t, a) for t, a in ev if 0 < t <= EARLY * ev[-1][0]]
    return within[-1] if within else next(((t, a) for t, a in ev if t > 0), ev[-1])


def run_minutes(rows: list[dict]) -> float:
    """A run's minutes at its median pace. Its wall time (the rows' cumulative `time_total_s`)
    counts the pauses of its process and passing slowdowns from other jobs, so the seconds per
    step between logged rows are taken at their median over the run (a job sharing the cores
    for the whole run still slows it); the first row's time (start-up, base evaluation)
    counts as logged."""
    t = [(r["step"], r["time_total_s"]) for r in rows if "time_total_s" in r]
    pace = [(tb - ta) / (sb - sa) for (sa, ta), (sb, tb) in zip(t, t[1:]) if sb > sa]
    return (t[0][1] + (t[-1][0] - t[0][0]) * (statistics.median(pace) if pace else 0.0)) / 60


def steps_to(recs: list[dict], threshold: float) -> str:
    """First evaluated step at which the seed-mean accuracy reaches `threshold` (§4.2)."""
    by_step: dict[int, list[float]] = {}
    for rec in recs:
        for step, acc in _evals(rec):
            by_step.setdefault(step, []).append(acc)
    for step in sorted(by_step):
        if step > 0 and statistics.mean(by_step[step]) >= threshold:
            return str(step)
    return "not reached"


@dataclasses.dataclass(frozen=True)
class Judged:
    """One comparison of an item: its test, Holm-adjusted p and result ("higher", "lower",
    "level", or "n/a: why" while a side has fewer than 2 seeds)."""

    comparison: items_lib.Comparison
    test: stats.Test
    adjusted_p: float
    result: str

    @property
    def way(self) -> str:
        """"for" (the paper's way), "against", "level" or "open"."""
        if self.result.startswith("n/a"):
            return "open"
        if self.result == "level":
            return "level"
        return "for" if self.result == self.comparison.expect else "against"


def _values(s: dict[str, dict], label: str, metric: str) -> list[float]:
    return s.get(label, {}).get(metric, [])


def _scale(c: items_lib.Comparison) -> tuple[float, str]:
    """Accuracies compare in percentage points; other metrics in their own units."""
    accuracy = all(m in ("final", "early") for _, _, m in c.terms)
    return (100.0, " pts") if accuracy else (1.0, "")


def judge(item: items_lib.Item, s: dict[str, dict]) -> list[Judged]:
    """Every comparison of the item, Holm-adjusted within the item (a comparison not
    testable yet counts as one of the family's largest p-values: `stats.holm`)."""
    tests, result = [], {}
    for c in item.comparisons:
        sides = [_values(s, label, m) for _, label, m in c.terms]
        tests.append(stats.contrast(terms=[(k, x) for (k, _, _), x in zip(c.terms, sides)],
                                    ref=c.ref))
        if any(not x for x in sides):
            result[c.name] = "n/a (no record)"
        elif any(len(x) < 2 for x in sides):
            result[c.name] = "n/a (1 seed)"
    tested = [i for i, c in enumerate(item.comparisons) if c.name not in result]
    adjusted = dict(zip(tested, stats.holm([tests[i].p for i in tested],
                                           len(item.comparisons))))
    out = []
    for i, c in enumerate(item.comparisons):
        q = adjusted.get(i, math.nan)
        r = result.get(c.name) or stats.direction(test=tests[i], adjusted_p=q)
        out.append(Judged(c, tests[i], q, r))
    return out


def counts(judged: list[Judged]) -> dict[str, int]:
    """How many comparisons go the paper's way ("for"), against it, level, not yet judged."""
    n = collections.Counter(j.way for j in judged)
    return {"n": len(judged), **{k: n[k] for k in ("for", "against", "level", "open")}}


def verdict_word(c: dict[str, int], *, some: bool = False) -> str:
    """The item's word, a function of its counts only (k for, m against, of n):
    "every comparison" claims: holds (k = n), partly (0 < k < n), does not hold (k = 0 < m),
    not shown (k = m = 0: every comparison level). "Some comparison" claims (`some`): holds
    (k ≥ 1), else does not hold (m ≥ 1) or not shown. While comparisons are open (a run
    without 2 seeds): incomplete, unless the open ones cannot change the word (every-claim:
    k ≥ 1 and m ≥ 1 is partly whatever they give; some-claim: k ≥ 1 holds) — adjusted p only
    fall as the family fills (`stats.holm`), so a "for" or "against" stays."""
    k, m, n, open_ = c["for"], c["against"], c["n"], c["open"]
    if some:
        if k:
            return "holds"
        return "incomplete" if open_ else "does not hold" if m else "not shown"
    if open_:
        return "partly" if k and m else "incomplete"
    return "holds" if k == n else "partly" if k else "does not hold" if m else "not shown"


def tally(c: dict[str, int]) -> str:
    """"k of n go the paper's way, m against, rest level" (+ open ones)."""
    text = f"{c['for']} of {c['n']} go the paper's way, {c['against']} against, " + (
        f"{c['level']} level" if c["open"] else "rest level")
    return text + (f", {c['open']} not judged yet" if c["open"] else "")


def short_result(j: Judged) -> str:
    """One comparison in a sentence."""
    if j.way == "open":
        return f"{j.comparison.name}: {j.result}"
    scale, unit = _scale(j.comparison)
    t = j.test
    text = (f"{j.comparison.name}: {scale * t.diff:+.{_digits(scale)}f}{unit} "
            f"[{scale * t.low:+.{_digits(scale)}f}, {scale * t.high:+.{_digits(scale)}f}], "
            f"Holm p {fmt_p(j.adjusted_p)}: {j.result}")
    if j.way == "level":
        return text + f" (detectable: ±{scale * t.mde:.{_digits(scale)}f}{unit})"
    return text + (" (the paper's way)" if j.way == "for" else " (against the paper)")


def _digits(scale: float) -> int:
    return 1 if scale == 100 else 4


def fmt_p(p: float) -> str:
    return "—" if p != p else f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


def verdict(item: items_lib.Item, s: dict[str, dict]) -> tuple[str, str]:
    """(short verdict, explanation) of the item's claim from the per-label summaries: the
    word of `verdict_word` with its counts, and each comparison in a sentence."""
    if not item.comparisons:
        return "see table", "descriptive item: read the table and plots"
    if not any(v.get("final") for v in s.values()):
        return "not run", "no records"
    judged = judge(item, s)
    c = counts(judged)
    if c["open"] == c["n"]:
        return "incomplete", "no comparison of the claim has 2 seeds on every side yet: " \
            + "; ".join(short_result(j) for j in judged)
    word = verdict_word(c, some=item.some)
    why = f"{tally(c)}: " + "; ".join(short_result(j) for j in judged)
    if extra := notes_text(item, s):
        why += f". {extra}"
    return f"{word} ({c['for']}/{c['n']} for, {c['against']} against)", why


def notes_text(item: items_lib.Item, s: dict[str, dict]) -> str:
    """What an item reads beside its comparisons (its `notes`; not part of the verdict's
    counts)."""
    return ". ".join(filter(None, (note(s) for note in item.notes)))


def comparison_table(judged: list[Judged]) -> list[str]:
    """The Markdown table of an item's comparisons."""
    lines = ["| comparison | the paper expects | difference [95 % interval] | Welch p | "
             "Holm p | result |", "|---|---|---|---|---|---|"]
    for j in judged:
        scale, unit = _scale(j.comparison)
        t, d = j.test, _digits(scale)
        diff = "—" if t.diff != t.diff else (
            f"{scale * t.diff:+.{d}f}{unit} [{scale * t.low:+.{d}f}, {scale * t.high:+.{d}f}]")
        if j.way == "level":
            res = (f"level (smallest effect these seeds detect: ±{scale * t.mde:.{d}f}{unit} "
                   f"at 80 % power)")
        else:
            res = j.result + {"for": " (the paper's way)", "against": " (against the paper)",
                              "open": ""}[j.way]
        lines.append(f"| {j.comparison.name} | {j.comparison.expect} | {diff} | {fmt_p(t.p)} | "
                     f"{fmt_p(j.adjusted_p)} | {res} |")
    return lines


def _metric_cell(values: list[float], n_recs: int, key: str) -> str:
    """A metric's mean ± sd over the seeds that log it, saying so when some do not (a metric
    added after their runs)."""
    cell = fmt(values, digits=0 if key == "budget_trajectories" else 4)
    return cell if not values or len(values) == n_recs else f"{cell} ({len(values)} seeds)"


def _source(recs: list[dict]) -> str | None:
    """The base a run's records start from (None for records without one)."""
    return (recs[0].get("base") or {}).get("source") if recs else None


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


def shared_runs(item: items_lib.Item) -> list[str]:
    """Which of the item's runs other items reuse (the same directory and records), and which
    of its comparisons other items count too: their verdicts are not independent evidence."""
    others = [o for o in items_lib.ITEMS.values() if o.name != item.name]
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
    commit is the parent of the commit that added the record: `experiments/provenance.py`)."""
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


def summaries(data: dict[str, list[dict]], metrics: tuple[str, ...]) -> tuple[dict, int]:
    """Each run's `summarize`, with §4.2's steps to the baseline's final, and how many bases
    the baselines start from. Steps count against GSPO on the same base (C.1's sizes each
    start from their own): per base source, the first of GSPO, GSPO <variant>, first row."""
    s = {label: summarize(recs, metrics) for label, recs in data.items()}
    thresholds: dict[str | None, float] = {}
    for label in ["GSPO", *(x for x in s if x.startswith("GSPO ")), next(iter(s), None)]:
        if label in s and s[label]["final"]:
            thresholds.setdefault(_source(data[label]), statistics.mean(s[label]["final"]))
    for label, recs in data.items():  # for §4.2's verdict
        if recs and _source(recs) in thresholds:
            s[label]["steps_to"] = steps_to(recs, thresholds[_source(recs)])
            s[label]["last_step"] = max(step for rec in recs for step, _ in _evals(rec))
    return s, len(thresholds)


def run_table(item: items_lib.Item, runs, data: dict[str, list[dict]], s: dict[str, dict],
              n_bases: int) -> list[str]:
    """The Markdown table of the runs: seeds, accuracies, steps to the baseline's final, the
    item's metrics, minutes per run, the paper's number."""
    reference = "GSPO's" if "GSPO" in s else "the first row's"
    head = ["run", "seeds", "base (%)", "final (%)", "gain (pts)",
            f"steps to {reference} final" + (" on its base" if n_bases > 1 else ""),
            *item.metrics, "min / run (median pace)", "paper"]
    lines = ["", "Mean ± sd over each run's seeds.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        v, recs = s[r.label], data[r.label]
        cells = [r.label, str(len(recs)), fmt(v["base"], 100), fmt(v["final"], 100),
                 fmt(v["gain"], 100), v.get("steps_to", "—"),
                 *(_metric_cell(v.get(k, []), len(recs), k) for k in item.metrics),
                 fmt(v["time_min"]), item.paper.get(r.label, "—")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def verdict_block(item: items_lib.Item, runs, seeds: int, data: dict[str, list[dict]],
                  s: dict[str, dict]) -> tuple[list[str], dict]:
    """The comparisons' table, the verdict line and the seeds said, and the item's json."""
    short, why = verdict(item, s)
    judged = judge(item, s) if item.comparisons else []
    c = counts(judged)
    if mixed := mixed_bases(data):
        # Never compare runs that started from different policies (records' `base`).
        short, why = "mixed bases", f"{mixed}; rerun them on one base"
    if missing_runs := [r.label for r in runs if not data[r.label]]:
        # A verdict from part of the grid says so (also in the summary table).
        short += f" (so far: {len(runs) - len(missing_runs)} of {len(runs)} runs)"
        why += f"; not run yet: {', '.join(missing_runs)}"
    capped = [r for r in runs if r.seeds(seeds) < seeds]
    n_seeds = [len(data[r.label]) for r in runs if r not in capped]
    n, most = min(n_seeds, default=0), max(n_seeds, default=0)
    span = str(n) if n == most else f"{n}-{most}"
    if not missing_runs and n < item.min_seeds:  # a verdict on fewer seeds than asked is early
        short += f" (so far: {n} of {item.min_seeds} seeds{'' if n == most else ' in some runs'})"
    lines = []
    if judged:
        lines += ["", f"## The claim's comparisons ({'some' if item.some else 'every'} one "
                  "should go the paper's way)", "",
                  "Welch's test of each difference of seed means (runs may have different "
                  "seed counts), Holm-adjusted over this item's comparisons; \"higher\" / "
                  "\"lower\" needs Holm p < 0.05 (experiments/results/README.md, \"The "
                  "rule\").", "", *comparison_table(judged)]
    # With a comparison table above, the verdict line gives its counts and what else it read.
    said = why if not judged or short.startswith("mixed") else ". ".join(
        [tally(c), *filter(None, [notes_text(item, s)])])
    if missing_runs and judged:
        said += f"; not run yet: {', '.join(missing_runs)}"
    lines += ["", f"**Holds here?** {short}: {said}.", "",
              f"Seeds per run: {span} (the item asks for at "
              f"least {item.min_seeds})."
              + ("" if n >= item.min_seeds else " FEWER than asked: read with care.")]
    lines += [f"{r.label}: {len(data[r.label])} seed(s) of the {r.seeds(seeds)} planned: "
              f"{r.why_fewer}." for r in capped]
    return lines, {"verdict": short, "why": why, "seeds": n, "counts": c}


def provenance_lines(item: items_lib.Item, data: dict[str, list[dict]]) -> list[str]:
    """The runs shared with other items, the code and hosts of the records, truncations."""
    lines = []
    if shared := shared_runs(item):
        lines += ["", "Shared with other items: " + "; ".join(shared) + "."]
    lines += ["", f"Code (commit of each record): {code_versions(data)}."]
    if changed := code_changes({r.get("commit", "") for recs in data.values() for r in recs}):
        lines += [changed]
    if cut := truncated(data):
        lines += ["", "Truncated records: " + "; ".join(cut) + "."]
    if host_list := hosts(data):
        lines += ["", f"Hosts: {host_list}."]
    return lines


def write_item(item: items_lib.Item, *, runs, seeds: int, records_dir: Path, out_dir: Path,
               command: str, missing: str) -> list[Path]:
    """<item>.md, .json and .png from the records of `runs` (`seeds` of each at most)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / f"{item.name}.md", out_dir / f"{item.name}.json"
    lines = [f"# {item.title}", "", f"The paper's claim: {item.claim}.", "",
             f"Produced by `{command}` from the records in `{records_dir.name}/`."]
    if missing:
        lines += ["", f"**Not run**: {missing}. The method this item needs is not implemented "
                  "yet, so there is no result; nothing here is estimated."]
        md.write_text("\n".join(lines) + "\n")
        js.write_text(json.dumps({"verdict": "not run", "why": missing}) + "\n")
        return [md, js]
    data = {r.label: load(records_dir, r, r.seeds(seeds)) for r in runs}
    s, n_bases = summaries(data, item.metrics)
    lines += run_table(item, runs, data, s, n_bases)
    said, result = verdict_block(item, runs, seeds, data, s)
    lines += said + provenance_lines(item, data)
    png = out_dir / f"{item.name}.png"
    caption = plots.plot_item(item, data=data, summaries=s, path=png)
    lines += ["", f"![{item.name}]({item.name}.png)", "", f"*{caption}*"]
    md.write_text("\n".join(lines) + "\n")
    js.write_text(json.dumps(result) + "\n")
    return [md, js, png]
