"""Tables, plots and verdicts of the reproduction, from committed run records only.

A record (experiments/reproduce.py) holds a run's config and its per-step rows. For each item
this writes <out>/<task>/<item>.md (mean ± sd over seeds, the paper's number beside ours, a
verdict in words), <item>.png (held-out accuracy over steps with a ±1 sd band over seeds, and
the item's own per-step metrics) and <item>.json (the verdict, for the summary table).

"Higher" / "lower" below means the difference of the seed means exceeds twice its standard
error, sqrt(sd_a²/n_a + sd_b²/n_b); otherwise "level". With 2-3 seeds that is a coarse test: a
"level" says the seeds cannot tell the two apart, not that they are equal. An "every pair"
claim needs each of its pairs to win, which a loose per-pair test cannot make easier; a "some
cell wins" claim (`variants`, 7 cells) would be won by chance far too often, so its win also
needs Welch's t-test at p < 0.05 after Holm's correction over the cells.
"""

from __future__ import annotations

import collections
import json
import math
import statistics
from pathlib import Path

import numpy as np

from experiments import items as items_lib


def load(records_dir: Path, r: items_lib.Run, seeds: int) -> list[dict]:
    out = []
    for s in range(seeds):
        path = records_dir / f"{r.name}_s{s}.json"
        if path.exists():
            out.append(json.loads(path.read_text()))
    return out


def _evals(rec: dict) -> list[tuple[int, float]]:
    return [(row["step"], row["eval_accuracy"]) for row in rec["rows"] if "eval_accuracy" in row]


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return math.nan, math.nan
    return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else math.nan


def fmt(xs: list[float], scale: float = 1.0, digits: int = 1) -> str:
    m, sd = _mean_sd(xs)
    if m != m:
        return "—"
    return f"{m * scale:.{digits}f}" + ("" if sd != sd else f" ± {sd * scale:.{digits}f}")


def compare(a: list[float], b: list[float]) -> str:
    """'higher' / 'lower' / 'level' of a against b (see the module docstring)."""
    if not a or not b:
        return "n/a (no record)"
    if len(a) < 2 or len(b) < 2:
        return "n/a (1 seed)"
    (ma, sa), (mb, sb) = _mean_sd(a), _mean_sd(b)
    se = math.sqrt(sa**2 / len(a) + sb**2 / len(b))
    return "higher" if ma - mb > 2 * se else "lower" if mb - ma > 2 * se else "level"


def welch_p(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of Welch's t-test that a and b have the same mean (nan with fewer
    than 2 seeds on a side; 0 or 1 when neither side varies)."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    (ma, sa), (mb, sb) = _mean_sd(a), _mean_sd(b)
    va, vb = sa**2 / len(a), sb**2 / len(b)
    if va + vb == 0:
        return float(ma == mb)
    from scipy import stats  # a dependency of jax

    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return float(2 * stats.t.sf(abs(ma - mb) / math.sqrt(va + vb), df))


def holm(ps: list[float], m: int) -> list[float]:
    """Holm-adjusted p-values of `ps` (in their order) in a family of m ≥ len(ps) hypotheses.
    The m - len(ps) not tested yet count as the largest p-values: a hypothesis rejected so is
    rejected however they fall, so a win can be settled before its family is complete."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [1.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def summarize(recs: list[dict], metrics: tuple[str, ...]) -> dict:
    """Per-seed values of a run: base, final, gain, and each metric's mean over logged steps."""
    out = {"base": [], "final": [], "gain": [], "time_min": []}
    for rec in recs:
        ev = _evals(rec)
        out["base"].append(ev[0][1])
        out["final"].append(ev[-1][1])
        out["gain"].append(ev[-1][1] - ev[0][1])
        if any("time_total_s" in row for row in rec["rows"]):
            out["time_min"].append(run_minutes(rec["rows"]))
    for k in metrics:
        # The budget spent is the last row's (a cumulative count); the rest, means over steps.
        pick = (lambda v: v[-1]) if k == "budget_trajectories" else statistics.mean
        out[k] = [pick(v) for rec in recs
                  if (v := [row[k] for row in rec["rows"] if k in row and row["step"] > 0])]
    return out


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


def _unjudged(finals: dict, why: str) -> tuple[str, str]:
    """The verdict of an item whose compared runs are not all recorded yet."""
    return "incomplete" if finals else "not run", why


def verdict(item: items_lib.Item, s: dict[str, dict]) -> tuple[str, str]:
    """(short verdict, explanation) of the item's claim from the per-label summaries."""
    f = {label: v["final"] for label, v in s.items() if v["final"]}
    c = lambda a, b: compare(f.get(a, []), f.get(b, []))  # noqa: E731
    if item.name == "appendix_a":
        if "IBPO-GSPO" not in f:
            return "not run", "no IBPO-GSPO records"
        cov = s["IBPO-GSPO"].get("cov_y_phi", [])
        ratio = s["IBPO-GSPO"].get("pg_var_ratio", [])
        i_ok = bool(cov) and max(cov) < 0
        ii_ok = bool(ratio) and statistics.mean(ratio) <= 0.8
        return ("holds" if i_ok and ii_ok else "partly" if i_ok or ii_ok else "does not hold",
                f"mean Cov(Y, φ) per seed {fmt(cov, digits=4)} (claim i: < 0); PG-variance ratio "
                f"IBPO / GSPO {fmt(ratio, digits=3)} (claim ii: about 0.70)")
    if item.name == "curves":
        if not {"IBPO-GSPO", "GSPO"} <= f.keys():
            return _unjudged(f, "needs both GSPO and IBPO-GSPO records")
        m = compare(s["IBPO-GSPO"]["reward_mean"], s["GSPO"]["reward_mean"])
        v = compare(s["IBPO-GSPO"]["reward_var"], s["GSPO"]["reward_var"])
        ok = m == "higher" and v == "lower"
        short = "undetermined" if m.startswith("n/a") else "holds" if ok else "does not hold"
        return short, (f"against GSPO's, IBPO's mean training reward is {m} and its reward "
                       f"variance {v}")
    if item.name == "speed":
        if not {"IBPO-GSPO", "GSPO"} <= f.keys():
            return _unjudged(f, "needs both GSPO and IBPO-GSPO records")
        reached, total = s["IBPO-GSPO"]["steps_to"], s["GSPO"]["last_step"]
        target = f"GSPO's final, {100 * statistics.mean(f['GSPO']):.1f} %"
        if reached == "not reached":
            return "does not hold", (f"IBPO-GSPO's seed mean never reaches {target}, in "
                                     f"its {total} steps")
        share = int(reached) / total
        return ("holds" if share <= 150 / 400 else "does not hold",
                f"IBPO-GSPO's seed mean reaches {target}, at step {reached} of {total} "
                f"({share:.0%}; the paper: 150 of 400, 38 %)")
    if item.name == "sizes":  # the half size first, then the default (the larger)
        half = (f"GSPO {items_lib.HALF}", f"IBPO {items_lib.HALF}")
        if not {"GSPO", "IBPO-GSPO", *half} <= f.keys():
            return _unjudged(f, "needs GSPO and IBPO-GSPO records at both sizes")
        gain = lambda a, b: statistics.mean(f[a]) - statistics.mean(f[b])  # noqa: E731
        g_small, g_large = gain(half[1], half[0]), gain("IBPO-GSPO", "GSPO")
        r_small, r_large = c(half[1], half[0]), c("IBPO-GSPO", "GSPO")
        ok = r_large == "higher" and g_large > g_small
        return ("holds" if ok else "partly" if "higher" in (r_small, r_large)
                else "does not hold",
                f"IBPO - GSPO: {100 * g_small:+.1f} pts at {items_lib.HALF} ({r_small}), "
                f"{100 * g_large:+.1f} at the default size ({r_large})")
    pairs = {  # (challenger, baseline) pairs whose direction the paper claims
        "table1": [("IBPO-GSPO", b) for b in ("GSPO", "GRPO", "PRM+GSPO", "SCoRe+GRPO")],
        "table2a": [("edit distance", "GSPO"), ("IBPO-GSPO", "edit distance")],
        "table2b": [("λ=0.5", "GSPO"), ("λ=0.5", "λ=0.1"), ("λ=0.5", "λ=2.0"),
                    ("GSPO", "λ=2.0")],
        "group_size": [*((f"IBPO G={g}", f"GSPO G={g}") for g in (4, 8, 16)),
                       ("GSPO G=16", "GSPO G=4"), ("IBPO G=16", "IBPO G=4")],  # improve with G
        "optimizers": [("IBPO-GRPO", "GRPO"), ("IBPO-GSPO", "GSPO"), ("IBPO-PPO", "PPO")],
        "appendix_b": [("IBPO-GSPO + corrections", "IBPO-GSPO")],
        "cancellation": items_lib.CANCELLATION_FIXES,
        # Each IBPO variant against GSPO with the same advantage normalization.
        "variants": [(label, "GSPO no std division" if "no std" in label else "GSPO")
                     for label in (r.label for r in item.runs) if not label.startswith("GSPO")],
    }.get(item.name, [])
    if not pairs:
        return "see table", "descriptive item: read the table and plots"
    res = [(a, b, c(a, b)) for a, b in pairs if a in f and b in f]
    text = "; ".join(f"{a} vs {b}: {r}" for a, b, r in res)
    if not res:
        return _unjudged(f, "no pair the claim compares has records on both sides yet"
                         if f else "no records")
    if all(r.startswith("n/a") for *_, r in res):
        return "undetermined", text + " (one seed cannot say)"
    judged = [r for *_, r in res if not r.startswith("n/a")]
    wins = judged.count("higher")
    open_pairs = len(pairs) - len(judged)  # unrecorded, or one seed on a side
    if item.name == "variants":  # "some variant": a win settles it, a non-win needs every cell
        return _some_cell_wins(res, f, len(pairs))
    if item.name == "cancellation":
        text = f"final accuracy, each fix against what it fixes: {text}; {_mechanisms(s)}"
    # "Every pair": settled once every pair is judged, or by a win beside a non-win (partly);
    # until then the pairs judged so far cannot say how the others will fall.
    if open_pairs and not 0 < wins < len(judged):
        return "incomplete", text + f" ({open_pairs} of {len(pairs)} pairs not judged yet)"
    return ("holds" if wins == len(pairs) else "partly" if wins else "does not hold", text)


def _mechanisms(s: dict[str, dict]) -> str:
    """What the cancellation grid measures of M1 and M2 (DESIGN §5), beside its accuracies."""
    checks = (("M1, the residual before the update", "cancellation_residual",
               "seq_mean_token_mean / none", "token_mean / none"),
              # M2 first on token_mean, which has no M1 residual to mask it.
              *(("M2, the residual at the current ratios", "cancellation_residual_updates",
                 f"{agg} / clip-higher", f"{agg} / none")
                for agg in sorted(items_lib.CLIP_HIGHER_ON, key=lambda a: a != "token_mean")),
              ("the residual min_replace leaves", "cancellation_residual_updates",
               "seq_mean_token_mean / none", "seq_mean_token_mean / min_replace"))
    out = []
    for what, key, a, b in checks:
        if key in s.get(a, {}) and key in s.get(b, {}) and s[a][key] and s[b][key]:
            rel = compare(s[a][key], s[b][key])
            out.append(f"{what}: {a} {fmt(s[a][key], digits=4)} is {rel}"
                       f" {'than' if rel in ('higher', 'lower') else 'with'} {b}"
                       f" {fmt(s[b][key], digits=4)}")
    return "; ".join(out) or "mechanisms: no records yet"


def _some_cell_wins(res: list[tuple[str, str, str]], f: dict, m: int, alpha: float = 0.05
                    ) -> tuple[str, str]:
    """The verdict of "some cell beats its baseline" over a family of m cells: a win is higher
    by the 2-SE rule and by Welch's t-test at Holm-adjusted p < alpha (see `holm`)."""
    judged = [(a, b, r) for a, b, r in res if not r.startswith("n/a")]
    adjusted = holm([welch_p(f[a], f[b]) for a, b, _ in judged], m)
    notes = {(a, b): f"{r} (p {welch_p(f[a], f[b]):.2g}, Holm {q:.2g})"
             for (a, b, r), q in zip(judged, adjusted)}
    wins = [a for (a, b, r), q in zip(judged, adjusted) if r == "higher" and q < alpha]
    text = "; ".join(f"{a} vs {b}: {notes.get((a, b), r)}" for a, b, r in res)
    text += (f" (a win needs Welch p < {alpha} after Holm's correction over the {m} cells"
             + (f"; {m - len(judged)} not judged yet)" if len(judged) < m else ")"))
    short = "holds" if wins else "undetermined" if len(judged) < m else "does not hold"
    return short, text


def _plot(item: items_lib.Item, data: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_budget = "budget_trajectories" in item.metrics  # methods stop at different steps
    keys = ("eval_accuracy", *(k for k in item.metrics if k != "budget_trajectories"))
    cols = min(4, len(keys))  # panels wrap into rows of 4
    rows_n = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.6 * cols, 3.4 * rows_n), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys):
        if by_budget:  # each seed's evaluations against the budget it had spent
            for i, (label, recs) in enumerate(data.items()):
                for k, rec in enumerate(recs):
                    rows = [row for row in rec["rows"] if key in row]
                    ax.plot([row.get("budget_trajectories", 0) for row in rows],
                            [row[key] for row in rows], color=f"C{i}", marker="o", ms=3,
                            alpha=0.7, label=label if k == 0 else None)
            ax.set_title(key)
            ax.set_xlabel("budget_trajectories")
            continue
        for label, recs in data.items():
            series = [{row["step"]: row[key] for row in rec["rows"] if key in row} for rec in recs]
            series = [x for x in series if x]  # seeds that log the key
            steps = sorted(set.intersection(*(set(x) for x in series))) if series else []
            if not steps:
                continue
            v = np.array([[x[t] for t in steps] for x in series])
            m, sd = v.mean(0), v.std(0, ddof=1) if len(v) > 1 else np.zeros(len(steps))
            ax.plot(steps, m, marker="o" if key == "eval_accuracy" else None, ms=3, label=label)
            ax.fill_between(steps, m - sd, m + sd, alpha=0.2)
        ax.set_title(key)
        ax.set_xlabel("RL step")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(item.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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


def write_item(item: items_lib.Item, *, runs, seeds: int, records_dir: Path, out_dir: Path,
               command: str, missing: str) -> list[Path]:
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
    s = {label: summarize(recs, item.metrics) for label, recs in data.items()}
    # §4.2's steps to the baseline's final, against GSPO on the same base (C.1's sizes each
    # start from their own): per base source, the first of GSPO, GSPO <variant>, first row.
    thresholds: dict[str | None, float] = {}
    for label in ["GSPO", *(x for x in s if x.startswith("GSPO ")), next(iter(s))]:
        if label in s and s[label]["final"]:
            thresholds.setdefault(_source(data[label]), statistics.mean(s[label]["final"]))
    for label, recs in data.items():  # for §4.2's verdict
        if recs and _source(recs) in thresholds:
            s[label]["steps_to"] = steps_to(recs, thresholds[_source(recs)])
            s[label]["last_step"] = max(step for rec in recs for step, _ in _evals(rec))
    reference = "GSPO's" if "GSPO" in s else "the first row's"
    head = ["run", "seeds", "base (%)", "final (%)", "gain (pts)", "vs first row",
            f"steps to {reference} final" + (" on its base" if len(thresholds) > 1 else ""),
            *item.metrics, "min / run (median pace)", "paper"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    first = next(iter(s.values()))["final"]
    for r in runs:
        v, recs = s[r.label], data[r.label]
        cells = [r.label, str(len(recs)), fmt(v["base"], 100), fmt(v["final"], 100),
                 fmt(v["gain"], 100),
                 compare(v["final"], first) if v["final"] and r is not runs[0] else "—",
                 v.get("steps_to", "—"),
                 *(_metric_cell(v.get(k, []), len(recs), k) for k in item.metrics),
                 fmt(v["time_min"]),
                 item.paper.get(r.label, "—")]
        lines.append("| " + " | ".join(cells) + " |")
    short, why = verdict(item, s)
    if mixed := mixed_bases(data):
        # Never compare runs that started from different policies (records' `base`).
        short, why = "mixed bases", f"{mixed}; rerun them on one base"
    if missing_runs := [r.label for r in runs if not data[r.label]]:
        # A verdict from part of the grid says so (also in the summary table).
        short += f" (so far: {len(runs) - len(missing_runs)} of {len(runs)} runs)"
        why += f"; not run yet: {', '.join(missing_runs)}"
    capped = [r for r in runs if r.seeds(seeds) < seeds]
    counts = [len(data[r.label]) for r in runs if r not in capped]
    n, most = min(counts, default=0), max(counts, default=0)
    span = str(n) if n == most else f"{n}-{most}"
    if not missing_runs and n < item.min_seeds:  # a verdict on fewer seeds than asked is early
        short += f" (so far: {n} of {item.min_seeds} seeds{'' if n == most else ' in some runs'})"
    lines += ["", f"**Holds here?** {short}: {why}.", "",
              f"Seeds per run: {span} (the item asks for at "
              f"least {item.min_seeds})."
              + ("" if n >= item.min_seeds else " FEWER than asked: read with care.")]
    lines += [f"{r.label}: {len(data[r.label])} seed(s) of the {r.seeds(seeds)} planned: "
              f"{r.why_fewer}." for r in capped]
    if host_list := hosts(data):
        lines += ["", f"Hosts: {host_list}."]
    lines += ["", f"![{item.name}]({item.name}.png)"]
    md.write_text("\n".join(lines) + "\n")
    js.write_text(json.dumps({"verdict": short, "why": why, "seeds": n}) + "\n")
    _plot(item, data, out_dir / f"{item.name}.png")
    return [md, js, out_dir / f"{item.name}.png"]


JUDGED = ("holds", "partly", "does not hold")


def overall(verdicts: dict[str, str]) -> str:
    """The summary's "holds here?" from each task's verdict (task -> verdict or "not run yet")."""
    short = {t: v if v in JUDGED else "" for t, v in verdicts.items()}
    pending = [t for t, v in verdicts.items()
               if v == "not run yet" or v.startswith("incomplete") or "(so far" in v]
    if pending:
        return "not yet: " + ", ".join(f"`{t}`" for t in pending) + " to run"
    if not all(short.values()):  # a probe's figure, "mixed bases", "undetermined": read them
        return "see the cells"
    kinds = set(short.values())
    if kinds == {"holds"}:
        return "**yes**" + (" (both tasks)" if len(short) > 1 else "")
    if kinds == {"does not hold"}:
        return "**no**" + (" (neither task)" if len(short) > 1 else "")
    if kinds == {"holds", "does not hold"}:
        return "only on " + ", ".join(f"`{t}`" for t, v in short.items() if v == "holds")
    return "partly"


def write_summary(out: Path, tasks: tuple[str, ...]) -> Path:
    """<out>/README.md: paper claim | one column per task | holds?"""
    lines = ["# Reproduction in miniature: which claims hold here", "",
             "Generated by `python -m experiments.reproduce ITEM` from the committed records; "
             "each cell links the item's results file. Every run starts from the committed "
             "base of its task (`experiments/warm_starts/`); results on the earlier, "
             "uncommitted bases are in [legacy/](legacy/README.md).", "",
             "| item | paper claim | " + " | ".join(f"on `{t}`" for t in tasks)
             + " | holds here? |",
             "|---|---|" + "---|" * len(tasks) + "---|"]
    for name in items_lib.ORDER:
        item = items_lib.ITEMS[name]
        verdicts = {}
        for t in tasks:
            js = out / t / f"{name}.json"
            verdicts[t] = json.loads(js.read_text())["verdict"] if js.exists() else "not run yet"
        cells = [v if v == "not run yet" else f"[{v}]({t}/{name}.md)"
                 for t, v in verdicts.items()]
        lines.append(f"| {item.title} | {item.claim} | " + " | ".join(cells)
                     + f" | {overall(verdicts)} |")
    out.mkdir(parents=True, exist_ok=True)  # a new --out with no records yet
    path = out / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path
