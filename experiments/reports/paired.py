"""The page of a paired item (`Item.paired`; issue 57's `oracle`): its arms compared seed by
seed, from its own records (runs/<task>/paired/).

Design: seed s of every arm trains on one host at one commit, back to back
(`experiments.reproduce` orders a paired item's runs seed-major and refuses a dirty tree), so a
comparison of arm a with arm b reads the per-seed differences d_s = final_a,s − final_b,s:
paired t with n − 1 df, its 95 % interval, Holm within the item's comparisons, and the smallest
|mean d| the pairs detect at 80 % power (`stats.paired`). Seed-to-seed variation of the
problems drawn and of the base's sampling is shared by both arms of a pair and cancels.

Provenance is checked, not assumed: a seed whose two records differ in host, or in commit,
or come from a dirty tree, is left out of that pair, and a comparison whose seeds come from
more than one commit is not paired at all; the page says which and why. Records of an older
commit stand for a newer one only where a rerun of one of their seeds there reproduces its
record exactly (`reuse`: how an arm added later pairs with arms trained before it).

The figure puts every operator on two axes per task: its first-error agreement with the
checker during training (the per-step `first_error_agreement`, mean over the run) against its
final accuracy's change over GSPO, with the paired 95 % interval; `oracle.png` in the results
root holds every task's panel.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

from experiments import items as items_lib
from experiments.items_oracle import PAIRS
from experiments.reports import report, reuse, stats
from experiments.reports.report_provenance import final_accuracy as final

BASELINE = "GSPO"


def records(item: items_lib.Item, task: str, records_dir: Path, seeds: int
            ) -> dict[str, dict[int, dict]]:
    """label -> seed -> record, of the item's runs on `task` (seeds 0..seeds-1 recorded)."""
    out = {}
    for r in item.runs_on(task):
        recs = {s: json.loads(p.read_text()) for s in range(seeds)
                if (p := records_dir / f"{r.name}_s{s}.json").exists()}
        if recs:
            out[r.label] = recs
    return out


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where the records come from: their (commit, host) groups with counts, the commits each
    record stands for (its own, and those a rerun carries it to: `reuse.carried`), and one
    sentence per rerun."""

    groups: list[str]
    commits: dict[str, dict[int, frozenset[str]]]
    reused: list[str]


def provenance(data: dict[str, dict[int, dict]],
               found: dict[str, list[tuple[int, dict]]] | None = None) -> Provenance:
    groups: dict[tuple[str, str], int] = {}
    for recs in data.values():
        for rec in recs.values():
            key = (str(rec.get("commit", "unknown"))[:10], rec.get("cpu") or "unknown")
            groups[key] = groups.get(key, 0) + 1
    commits, reused = reuse.carried(data, found or {})
    return Provenance([f"commit {c} on {cpu} ({n} records)"
                       for (c, cpu), n in sorted(groups.items())], commits, reused)


def pairable(data: dict[str, dict[int, dict]], prov: Provenance, a: str, b: str
             ) -> tuple[list[int], dict[int, str], str]:
    """(the seeds arms a and b pair on; the seeds left out, with why; why none pairs, or "").
    Seed s pairs when both records are clean, of one host, and stand for a common commit;
    the comparison asks one commit for all its seeds (hosts may differ from seed to seed:
    each pair's difference is taken on one)."""
    seeds, bad, shared = [], {}, []
    for s in sorted(set(data[a]) & set(data[b])):
        ra, rb = data[a][s], data[b][s]
        common = prov.commits[a][s] & prov.commits[b][s]
        if dirty := [x for x, r in ((a, ra), (b, rb)) if r.get("dirty") is not False]:
            bad[s] = f"records from a dirty tree ({', '.join(dirty)})"
        elif ra.get("cpu") != rb.get("cpu"):
            bad[s] = f"its arms ran on 2 hosts ({ra.get('cpu')}; {rb.get('cpu')})"
        elif not common:
            bad[s] = (f"its arms ran at 2 commits ({', '.join(sorted(prov.commits[a][s]))}; "
                      f"{', '.join(sorted(prov.commits[b][s]))}) and no rerun reproduces "
                      "one at the other")
        else:
            seeds.append(s)
            shared.append(common)
    if not shared or frozenset.intersection(*shared):
        return seeds, bad, ""
    commits = sorted(frozenset.union(*shared))
    return seeds, bad, (f"the seeds come from {len(commits)} commits ({', '.join(commits)}); "
                        "the item pairs seeds of one commit only: retrain the others at one, "
                        "or rerun one of their seeds at it (`--rerun`)")


def _reruns(item: items_lib.Item, task: str, records_dir: Path
            ) -> dict[str, list[tuple[int, dict]]]:
    """The reruns kept beside the item's records on `task` (`reuse.reruns`), by run label."""
    return reuse.reruns(records_dir, {r.label: r.name for r in item.runs_on(task)})


def run_mean(rec: dict, key: str) -> float | None:
    """A per-step metric's mean over the run's logged steps (None: never logged)."""
    values = [row[key] for row in rec["rows"] if key in row and row["step"] > 0]
    return statistics.mean(values) if values else None


def compare(data: dict[str, dict[int, dict]], prov: Provenance) -> list[dict]:
    """Every pair of `PAIRS` whose arms both have records: its seeds (`pairable`), test,
    Holm-adjusted p (over the pairs of the item on this task) and finding."""
    rows = []
    for a, b, question in PAIRS:
        if a not in data or b not in data:
            continue
        seeds, bad, why = pairable(data, prov, a, b)
        diffs = [] if why else [final(data[a][s]) - final(data[b][s]) for s in seeds]
        rows.append({"a": a, "b": b, "question": question, "seeds": seeds, "left_out": bad,
                     "why": why, "mean": statistics.mean(diffs) if diffs else math.nan,
                     "test": stats.paired(diffs)})
    tested = [i for i, r in enumerate(rows) if len(r["seeds"]) >= 2 and not r["why"]]
    adjusted = dict(zip(tested, stats.holm([rows[i]["test"].p for i in tested], len(rows))))
    for i, r in enumerate(rows):
        r["holm"] = adjusted.get(i, math.nan)
        r["finding"] = ("refused (provenance)" if r["why"] else "n/a (< 2 pairs)"
                        if i not in adjusted else stats.direction(test=r["test"],
                                                                  adjusted_p=r["holm"]))
    return rows


def _left_out(rows: list[dict]) -> list[str]:
    """The page's lines on seeds left out and comparisons refused, each reason once."""
    by: dict[tuple[int, str], list[str]] = {}
    for r in rows:
        for seed, reason in r["left_out"].items():
            by.setdefault((seed, reason), []).append(f"{r['a']} − {r['b']}")
    lines = []
    for (seed, reason), names in sorted(by.items()):
        where = ("every pair" if len(names) == len(rows) else "; ".join(names))
        lines += [f"**Seed {seed} left out of {where}:** {reason}.", ""]
    for why in dict.fromkeys(r["why"] for r in rows if r["why"]):
        names = "; ".join(f"{r['a']} − {r['b']}" for r in rows if r["why"] == why)
        lines += [f"**Not paired ({names}):** {why}.", ""]
    return lines


def _budgets(data: dict[str, dict[int, dict]]) -> list[str]:
    """A line on the arms whose rollouts and continuations spent another budget than GSPO's
    (`vouched_steps` samples continuations): steps and trajectories at their last row."""
    spent = {label: [(r["rows"][-1]["step"], r["rows"][-1].get("budget_trajectories", 0.0))
                     for r in recs.values()] for label, recs in data.items()}
    base = statistics.mean(b for _, b in spent.get(BASELINE, [(0, 0.0)])) or math.nan
    said = [f"{label} {statistics.mean(s for s, _ in v):.0f} steps, "
            f"{statistics.mean(b for _, b in v):,.0f} trajectories "
            f"({statistics.mean(b for _, b in v) / base:.2f}× {BASELINE}'s)"
            for label, v in spent.items() if abs(statistics.mean(b for _, b in v) / base - 1)
            > 0.005]
    return [f"Budget, mean over seeds at the last row: {'; '.join(said)}.", ""] if said else []


def _pts(x: float) -> str:
    return "—" if x != x else f"{100 * x:+.1f}"


def answer(rows: list[dict]) -> str:
    """Which of issue 57's explanations the pairs support, in a sentence."""
    found = {(r["a"], r["b"]): r for r in rows}
    oracle = [found[k] for k in (("oracle, sequence", "GSPO"), ("oracle, token", "GSPO"))
              if k in found]
    if not oracle or any(r["finding"].startswith(("n/a", "refused")) for r in oracle):
        return "not answered yet (the oracle arms need 2 paired seeds on one commit and host)"
    ibpo = found.get(("IBPO-GSPO", "GSPO"))
    if any(r["finding"] == "higher" for r in oracle):
        if ibpo is not None and ibpo["finding"] != "higher":
            return ("(a): perfect credit raises GSPO's accuracy where the paper's operator "
                    "does not, so φ's credit is what fails here")
        return "perfect credit helps, and so does the paper's operator: neither (a) nor (b)"
    if all(r["finding"] == "level" for r in oracle):
        most = max(r["test"].mde for r in oracle)
        return (f"(b) at this scale: even the checker's own first errors leave GSPO level "
                f"(detectable: ±{100 * most:.1f} points), so a better operator cannot "
                "help here either")
    return "(b), more than that: oracle credit lowers the accuracy"


def write(item: items_lib.Item, data: dict[str, dict[int, dict]], *, task: str,
          out_dir: Path, command: str, records_dir: Path) -> list[Path]:
    """<item>.md, .json and .png of one task."""
    prov = provenance(data, _reruns(item, task, records_dir))
    rows = compare(data, prov)
    arms = [r.label for r in item.runs_on(task) if r.label in data]
    lines = [f"# {item.title}", "", f"Asked: {item.claim}.", "",
             f"Produced by `{command}` from the records in `runs/{task}/{records_dir.name}/` "
             f"(a paired design: {item.min_seeds} seeds asked; seed s of every arm on one host "
             "at one commit, back to back" + ("; an arm added later pairs through a rerun "
                                              "that reproduces older records, below"
                                              if prov.reused else "")
             + "). Final held-out accuracy in %, mean ± sd over "
             "seeds; first-error agreement: the share of scored wrong responses whose first "
             "error under the run's operator is the checker's first wrong step, mean over the "
             "run's logged steps (GSPO's terminal operator names the first step of every "
             "wrong response: its agreement is the share wrong from their first step, the "
             "floor any operator starts from).", "",
             "| arm | seeds | final accuracy | first-error agreement | φ mean |",
             "|---|---|---|---|---|"]
    for label in arms:
        recs = list(data[label].values())
        agree = [x for r in recs if (x := run_mean(r, "first_error_agreement")) is not None]
        phi = [x for r in recs if (x := run_mean(r, "phi_mean")) is not None]
        lines.append(f"| {label} | {len(recs)} | {report.fmt([final(r) for r in recs], 100)} "
                     f"| {report.fmt(agree, 100)} | {report.fmt(phi, 1, 3)} |")
    lines += ["", "| comparison | pairs | Δ (points) | 95 % interval | p | Holm p | detectable "
              "| finding |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["test"]
        lines.append(f"| {r['a']} − {r['b']} ({r['question']}) | {len(r['seeds'])} | "
                     f"{_pts(t.diff)} | [{_pts(t.low)}, {_pts(t.high)}] | "
                     f"{report.fmt_p(t.p)} | {report.fmt_p(r['holm'])} | "
                     f"{'—' if t.mde != t.mde else f'±{100 * t.mde:.1f}'} | {r['finding']} |")
    most = max((len(v) for v in data.values()), default=0)
    said = answer(rows)
    if most < item.min_seeds and not said.startswith("not answered"):
        said = f"so far, at {most} of {item.min_seeds} seeds: {said}"
    lines += ["", f"**Answer:** {said}.", "", *_left_out(rows), *_budgets(data)]
    lines += [f"Code and hosts: {'; '.join(prov.groups)}.", ""]
    lines += [f"Reused (`experiments/reports/reuse.py`): {'; '.join(prov.reused)}.", ""
              ] if prov.reused else []
    lines += [f"![{item.name}]({item.name}.png)",
              "", f"*First-error agreement with the checker (x, mean ± sd over seeds) against "
              f"the final accuracy's change over {BASELINE} (y, paired mean and 95 % "
              "interval), one point per operator.*"]
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js, png = (out_dir / f"{item.name}.{ext}" for ext in ("md", "json", "png"))
    md.write_text("\n".join(lines) + "\n")
    short = (f"{most} of {item.min_seeds} seeds: " if most < item.min_seeds else "") + "; ".join(
        f"{r['a']} vs {r['b']}: {r['finding']}" for r in rows[:3])
    js.write_text(json.dumps({"verdict": short, "why": said, "seeds": most}) + "\n")
    plot([(task, data, rows)], png)
    return [md, js, png]


def points(data: dict[str, dict[int, dict]], rows: list[dict]
           ) -> list[tuple[str, float, float, float, float, float]]:
    """(arm, agreement mean, sd, Δ, low, high) of each arm compared with GSPO (the interval
    nan below 2 pairs)."""
    out = []
    for r in rows:
        if r["b"] != BASELINE:
            continue
        agree = [x for rec in data[r["a"]].values()
                 if (x := run_mean(rec, "first_error_agreement")) is not None]
        m, sd = stats.mean_sd(agree)
        t = r["test"]  # one pair: its difference, no interval
        out.append((r["a"], m, 0.0 if sd != sd else sd, r["mean"], t.low, t.high))
    return out


def plot(panels: list[tuple[str, dict, list[dict]]], path: Path) -> None:
    """One panel per task: agreement (%) against Δ final accuracy over GSPO (points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    markers = dict(zip([a for a, _, _ in PAIRS], "osD^v<>"))
    for ax, (task, data, rows) in zip(axes[0], panels):
        for arm, m, sd, d, lo, hi in points(data, rows):
            if d != d or m != m:
                continue
            err = [[100 * (d - lo)], [100 * (hi - d)]] if lo == lo else None
            ax.errorbar(100 * m, 100 * d, xerr=100 * sd, yerr=err, fmt=markers.get(arm, "o"),
                        capsize=3, label=arm)
        ax.axhline(0, color="grey", lw=0.8, ls="--")
        floor = [x for rec in data.get(BASELINE, {}).values()
                 if (x := run_mean(rec, "first_error_agreement")) is not None]
        if floor:  # the terminal operator names the first step: the agreement's floor
            ax.axvline(100 * statistics.mean(floor), color="grey", lw=0.8, ls=":",
                       label=f"{BASELINE} (first step named)")
        ax.set_xlim(0, 105)
        ax.set_title(f"{task}")
        ax.set_xlabel("first-error agreement with the checker (%)")
        ax.set_ylabel(f"final accuracy − {BASELINE} (points)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def probe(ctx: items_lib.ProbeContext) -> list[Path]:
    """The `probe` hook of a paired item: its page on ctx.task, and the figure of every task
    with records in the results root (nothing without records: "not run yet")."""
    data = records(ctx.item, ctx.task, ctx.records_dir, ctx.seeds)
    if not data:
        return []
    files = write(ctx.item, data, task=ctx.task, out_dir=ctx.out_dir, command=ctx.command,
                  records_dir=ctx.records_dir)
    if ctx.smoke:
        return files
    runs_root, panels = ctx.records_dir.parent.parent, []
    for task_dir in sorted(p for p in runs_root.iterdir() if p.is_dir()):
        sub = task_dir / ctx.records_dir.name
        if sub.is_dir() and (d := records(ctx.item, task_dir.name, sub, ctx.seeds)):
            found = _reruns(ctx.item, task_dir.name, sub)
            panels.append((task_dir.name, d, compare(d, provenance(d, found))))
    combined = ctx.out_dir.parent / f"{ctx.item.name}.png"
    plot(panels, combined)
    return [*files, combined]
