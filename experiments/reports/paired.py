"""The page of a paired item (`Item.paired`; issue 57's `oracle`): its arms compared seed by
seed, from its own records (runs/<task>/paired/).

Design: seed s of every arm trains on one host at one commit, back to back
(`experiments.reproduce` orders a paired item's runs seed-major and refuses a dirty tree), so a
comparison of arm a with arm b reads the per-seed differences d_s = final_a,s − final_b,s:
paired t with n − 1 df, its 95 % interval, Holm within the item's comparisons, and the smallest
|mean d| the pairs detect at 80 % power (`stats.paired`). Seed-to-seed variation of the
problems drawn and of the base's sampling is shared by both arms of a pair and cancels.

Provenance is checked, not assumed: a seed whose arms' records differ in commit or host, or
come from a dirty tree, is left out of every pair, and seeds of more than one commit are not
paired at all; the page says which and why.

The figure puts every operator on two axes per task: its first-error agreement with the
checker during training (the per-step `first_error_agreement`, mean over the run) against its
final accuracy's change over GSPO, with the paired 95 % interval; `oracle.png` in the results
root holds every task's panel.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from experiments import items as items_lib
from experiments.items_oracle import PAIRS
from experiments.reports import report, stats
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


def provenance(data: dict[str, dict[int, dict]]) -> tuple[list[str], str, dict[int, str]]:
    """(the (commit, host) groups of the records, each with its count; why nothing is paired,
    or ""; the seeds left out of every pair, with why). A seed pairs only when all its arms'
    records are clean and of one commit on one host; the item asks one commit for all its
    seeds (hosts may differ from seed to seed: each pair's difference is taken on one)."""
    groups: dict[tuple[str, str], int] = {}
    per_seed: dict[int, set[tuple[str, str]]] = {}
    dirty: dict[int, list[str]] = {}
    for label, recs in data.items():
        for seed, rec in recs.items():
            key = (str(rec.get("commit", "unknown"))[:10], rec.get("cpu") or "unknown")
            groups[key] = groups.get(key, 0) + 1
            per_seed.setdefault(seed, set()).add(key)
            if rec.get("dirty") is not False:
                dirty.setdefault(seed, []).append(label)
    listed = [f"commit {c} on {cpu} ({n} records)" for (c, cpu), n in sorted(groups.items())]
    bad = {s: f"its arms ran on {len(k)} (commit, host) pairs: "
              + "; ".join(f"{c} on {cpu}" for c, cpu in sorted(k))
           for s, k in per_seed.items() if len(k) > 1}
    bad.update({s: f"records from a dirty tree ({', '.join(labels)})"
                for s, labels in dirty.items() if s not in bad})
    commits = sorted({c for s, k in per_seed.items() if s not in bad for c, _ in k})
    why = (f"the seeds come from {len(commits)} commits ({', '.join(commits)}); the item pairs "
           "seeds of one commit only: retrain the others at one" if len(commits) > 1 else "")
    return listed, why, bad


def run_mean(rec: dict, key: str) -> float | None:
    """A per-step metric's mean over the run's logged steps (None: never logged)."""
    values = [row[key] for row in rec["rows"] if key in row and row["step"] > 0]
    return statistics.mean(values) if values else None


def compare(data: dict[str, dict[int, dict]], *, refused: bool,
            left_out: frozenset[int] | set[int] = frozenset()) -> list[dict]:
    """Every pair of `PAIRS` whose arms both have records: its seeds (those `left_out`
    excepted), test, Holm-adjusted p (over the pairs of the item on this task) and finding."""
    rows = []
    for a, b, question in PAIRS:
        if a not in data or b not in data:
            continue
        seeds = sorted((set(data[a]) & set(data[b])) - set(left_out))
        diffs = [final(data[a][s]) - final(data[b][s]) for s in seeds]
        rows.append({"a": a, "b": b, "question": question, "seeds": seeds,
                     "mean": statistics.mean(diffs) if diffs and not refused else math.nan,
                     "test": stats.paired([] if refused else diffs)})
    tested = [i for i, r in enumerate(rows) if len(r["seeds"]) >= 2 and not refused]
    adjusted = dict(zip(tested, stats.holm([rows[i]["test"].p for i in tested], len(rows))))
    for i, r in enumerate(rows):
        r["holm"] = adjusted.get(i, math.nan)
        r["finding"] = ("refused (provenance)" if refused else "n/a (< 2 pairs)"
                        if i not in adjusted else stats.direction(test=r["test"],
                                                                  adjusted_p=r["holm"]))
    return rows


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
    groups, why, bad = provenance(data)
    rows = compare(data, refused=bool(why), left_out=set(bad))
    arms = [r.label for r in item.runs_on(task) if r.label in data]
    lines = [f"# {item.title}", "", f"Asked: {item.claim}.", "",
             f"Produced by `{command}` from the records in `runs/{task}/{records_dir.name}/` "
             f"(a paired design: {item.min_seeds} seeds asked; seed s of every arm on one host "
             "at one commit, back to back). Final held-out accuracy in %, mean ± sd over "
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
    lines += ["", f"**Answer:** {said}.", ""]
    if why:
        lines += [f"**Not paired:** {why}.", ""]
    for seed, reason in sorted(bad.items()):
        lines += [f"**Seed {seed} left out of every pair:** {reason}.", ""]
    lines += [f"Code and hosts: {'; '.join(groups)}.", "", f"![{item.name}]({item.name}.png)",
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
            _, why, bad = provenance(d)
            panels.append((task_dir.name, d, compare(d, refused=bool(why), left_out=set(bad))))
    combined = ctx.out_dir.parent / f"{ctx.item.name}.png"
    plot(panels, combined)
    return [*files, combined]
