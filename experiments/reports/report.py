"""Tables, verdicts and provenance of the reproduction, from committed run records only.

A record (experiments/reproduce.py) holds a run's config and its per-step rows. For each item
this writes <out>/<task>/<item>.md (mean ± sd over seeds, the paper's number beside ours, each
of the claim's comparisons with its interval and p-values, a verdict from their counts, the
code and hosts that made the records), <item>.png (experiments/reports/plots.py) and
<item>.json (the verdict and its counts, for the summary table).

The rule (experiments/reports/stats.py; stated in experiments/results/README.md): each comparison of
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
from experiments.reports import plots, report_provenance, stats

# The probes' pages (credit, variants, prefix_credit) read these as report.*.
code_versions, hosts = report_provenance.code_versions, report_provenance.hosts


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
    out = {"base": [], "final": [], "gain": [], "time_min": [], "step_s": [], "step_cpu": [],
           "early": [], "early_step": []}
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
            out["step_s"].append(step_seconds(rec["rows"]))
            out["step_cpu"].append(rec.get("cpu") or "unknown")  # the host of that pace
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
    return (t[0][1] + (t[-1][0] - t[0][0]) * step_seconds(rows)) / 60


def step_seconds(rows: list[dict]) -> float:
    """A run's median seconds per step between its logged rows (`run_minutes`' pace: the
    intervals holding an evaluation count too, as in every run of the grid)."""
    t = [(r["step"], r["time_total_s"]) for r in rows if "time_total_s" in r]
    pace = [(tb - ta) / (sb - sa) for (sa, ta), (sb, tb) in zip(t, t[1:]) if sb > sa]
    return statistics.median(pace) if pace else 0.0


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


def trajectories_at(recs: list[dict], step: str) -> str:
    """The seeds' mean budget_trajectories at evaluated `step` (`steps_to`'s answer): runs
    that sample more per step (dynamic sampling) reach a step later in trajectories."""
    spent = [row["budget_trajectories"] for rec in recs for row in rec["rows"]
             if str(row["step"]) == step and "eval_accuracy" in row
             and "budget_trajectories" in row]
    return f"{statistics.mean(spent):,.0f}" if spent else "—" if step.isdigit() else step


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
        """"for" (the paper's way), "against", "level" or "open"; "found" for a difference
        where the paper makes no claim (`items.NO_CLAIM`)."""
        if self.result.startswith("n/a"):
            return "open"
        if self.result == "level":
            return "level"
        if self.comparison.expect == items_lib.NO_CLAIM:
            return "found"
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
    ways = ("for", "against", "level", "open") + (
        ("found",) if any(j.comparison.expect == items_lib.NO_CLAIM for j in judged) else ())
    return {"n": len(judged), **{k: n[k] for k in ways}}


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
    return text + {"for": " (the paper's way)", "against": " (against the paper)",
                   "found": ""}[j.way]


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
    if item.claimless and c["open"] < c["n"]:  # no claim to hold: what the runs show
        return found(judged), "; ".join(short_result(j) for j in judged) + "".join(
            f". {extra}" for extra in [notes_text(item, s)] if extra)
    if c["open"] == c["n"]:
        return "incomplete", "no comparison of the claim has 2 seeds on every side yet: " \
            + "; ".join(short_result(j) for j in judged)
    word = verdict_word(c, some=item.some)
    why = f"{tally(c)}: " + "; ".join(short_result(j) for j in judged)
    if extra := notes_text(item, s):
        why += f". {extra}"
    return f"{word} ({c['for']}/{c['n']} for, {c['against']} against)", why


def found(judged: list[Judged]) -> str:
    """The plain statement of an item without a claim: each comparison and its result."""
    return "; ".join(f"{j.comparison.name}: {j.result}" for j in judged)


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
                              "open": "", "found": ""}[j.way]
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
            s[label]["trajectories_to"] = trajectories_at(recs, s[label]["steps_to"])
            s[label]["last_step"] = max(step for rec in recs for step, _ in _evals(rec))
    return s, len(thresholds)


def run_table(item: items_lib.Item, runs, data: dict[str, list[dict]], s: dict[str, dict],
              n_bases: int) -> list[str]:
    """The Markdown table of the runs: seeds, accuracies, steps to the baseline's final, the
    item's metrics, minutes per run, the paper's number."""
    reference = "GSPO's" if "GSPO" in s else "the first row's"
    speed = [f"steps to {reference} final" + (" on its base" if n_bases > 1 else "")]
    speed += ["trajectories to it"] if item.speed_in_trajectories else []
    head = ["run", "seeds", "base (%)", "final (%)", "gain (pts)", *speed,
            *item.metrics, "min / run (median pace)", "paper"]
    lines = ["", "Mean ± sd over each run's seeds.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        v, recs = s[r.label], data[r.label]
        cells = [r.label, str(len(recs)), fmt(v["base"], 100), fmt(v["final"], 100),
                 fmt(v["gain"], 100), v.get("steps_to", "—"),
                 *([v.get("trajectories_to", "—")] if item.speed_in_trajectories else []),
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
    if mixed := report_provenance.mixed_bases(data):
        # Never compare runs that started from different policies (records' `base`).
        short, why = "mixed bases", f"{mixed}; rerun them on one base"
    if missing_runs := [r.label for r in runs if not data[r.label]]:
        # A verdict from part of the grid says so (also in the summary table).
        short += f" (so far: {len(runs) - len(missing_runs)} of {len(runs)} runs)"
        why += f"; not run yet: {', '.join(missing_runs)}"
    capped = [r for r in runs if r.seeds(seeds) < seeds]
    n_seeds = [len(data[r.label]) for r in runs if r not in capped]
    n, most = min(n_seeds, default=0), max(n_seeds, default=0)
    # Runs the item gives more seeds (`Run.min_seeds`) that have fewer so far.
    short_of = [r for r in runs if len(data[r.label]) < r.seeds(item.min_seeds) <= r.min_seeds]
    if not missing_runs and n < item.min_seeds:  # a verdict on fewer seeds than asked is early
        short += f" (so far: {n} of {item.min_seeds} seeds{'' if n == most else ' in some runs'})"
    elif not missing_runs and short_of:
        short += " (so far: " + ", ".join(f"{len(data[r.label])} of {r.min_seeds} seeds in "
                                          f"{r.label}" for r in short_of) + ")"
    lines = _comparisons_head(item) + comparison_table(judged) if judged else []
    # With a comparison table above, the verdict line gives its counts and what else it read.
    said = why if not judged or short.startswith("mixed") else ". ".join(
        [tally(c), *filter(None, [notes_text(item, s)])])
    if missing_runs and judged:
        said += f"; not run yet: {', '.join(missing_runs)}"
    if item.claimless and judged and not short.startswith("mixed"):
        said = ". ".join(filter(None, [notes_text(item, s), *(
            [f"not run yet: {', '.join(missing_runs)}"] if missing_runs else [])]))
        lines += ["", f"**What the runs show** (no claim of the papers' to hold): {short}"
                  + (f". {said}" if said else "") + "."]
    else:
        lines += ["", f"**Holds here?** {short}: {said}."]
    lines += ["", _seeds_line(item, runs, data, n, most, short_of)]
    lines += [f"{r.label}: {len(data[r.label])} seed(s) of the {r.seeds(seeds)} planned: "
              f"{r.why_fewer}." for r in capped]
    return lines, {"verdict": short, "why": why, "seeds": n, "counts": c}


def _comparisons_head(item: items_lib.Item) -> list[str]:
    """The heading and rule above an item's comparison table."""
    rule = ("Welch's test of each difference of seed means (runs may have different seed "
            "counts), Holm-adjusted over this item's comparisons; \"higher\" / \"lower\" needs "
            "Holm p < 0.05 (experiments/results/README.md, \"The rule\").")
    if item.claimless:
        return ["", "## Comparisons (the papers make no claim here: each says what the runs "
                "show)", "", rule, ""]
    return ["", f"## The claim's comparisons ({'some' if item.some else 'every'} one "
            "should go the paper's way)", "", rule, ""]


def _seeds_line(item: items_lib.Item, runs, data: dict[str, list[dict]], n: int, most: int,
                short_of: list[items_lib.Run]) -> str:
    """How many seeds the runs have against what the item (and its runs of more) ask."""
    span = str(n) if n == most else f"{n}-{most}"
    more = "".join(f"; {r.min_seeds} for {r.label}" for r in runs
                   if r.min_seeds > item.min_seeds)
    return (f"Seeds per run: {span} (the item asks for at least {item.min_seeds}{more})."
            + ("" if n >= item.min_seeds and not short_of
               else " FEWER than asked: read with care."))


def write_item(item: items_lib.Item, *, runs, seeds: int, records_dir: Path, out_dir: Path,
               command: str, missing: str, task: str = "") -> list[Path]:
    """<item>.md, .json and .png from the records of `runs` (`seeds` of each at most), on
    `task` (which items share its runs there; "": every item)."""
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
    lines += said + report_provenance.provenance_lines(item, data, task)
    png = out_dir / f"{item.name}.png"
    caption = plots.plot_item(item, data=data, summaries=s, path=png)
    lines += ["", f"![{item.name}]({item.name}.png)", "", f"*{caption}*"]
    md.write_text("\n".join(lines) + "\n")
    js.write_text(json.dumps(result) + "\n")
    return [md, js, png]
