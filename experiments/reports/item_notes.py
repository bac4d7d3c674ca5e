"""What some items add to their report (hooks named in experiments/items_*.py): sentences for
the verdict line (`notes`), read from the per-run summaries (`report.summarize`: run label ->
{"final": [a value per seed], metric: [...], ...}; "" when their runs have no records yet),
and where Table 2b's final-accuracy panel places each run (`FinalsAxis`)."""

from __future__ import annotations

import statistics

from experiments import items, items_paper, items_recipe
from experiments.reports import report, stats


def speed(s: dict[str, dict]) -> str:
    """§4.2: where "early" is read, and whether IBPO's seed mean reaches GSPO's final."""
    if not ({"IBPO-GSPO", "GSPO"} <= s.keys() and s["GSPO"]["final"]):
        return ""
    reached, total = s["IBPO-GSPO"].get("steps_to"), s["GSPO"].get("last_step")
    steps = sorted(set(s["IBPO-GSPO"]["early_step"]))
    return (f"\"early\" is the accuracy at step {'/'.join(map(str, steps))} of {total} "
            f"(the last evaluation within the paper's 150 of 400 steps); IBPO-GSPO's seed "
            f"mean {'never reaches' if reached == 'not reached' else 'reaches'} GSPO's "
            f"final ({100 * statistics.mean(s['GSPO']['final']):.1f} %)"
            + ("" if reached == "not reached" else f" at step {reached}"))


def pg_ratio(s: dict[str, dict]) -> str:
    """Appendix A: the PG-variance ratio beside the paper's, and what claim i asks."""
    ratio = s.get("IBPO-GSPO", {}).get("pg_var_ratio", [])
    return (f"The paper's PG-variance ratio is about 0.70; here {report.fmt(ratio, digits=3)} "
            f"(claim i asks Cov(Y, φ) < 0 at every checkpoint; the comparison tests the "
            f"seeds' means over their checkpoints)") if ratio else ""


def mechanisms(s: dict[str, dict]) -> str:
    """What the cancellation grid measures of M1 and M2 (DESIGN §5), beside its accuracies,
    by the same rule (Holm over these checks)."""
    checks = (("M1, the residual before the update", "cancellation_residual",
               "seq_mean_token_mean / none", "token_mean / none"),
              # M2 first on token_mean, which has no M1 residual to mask it.
              *(("M2, the residual at the current ratios", "cancellation_residual_updates",
                 f"{agg} / clip-higher", f"{agg} / none")
                for agg in sorted(items_paper.CLIP_HIGHER_ON, key=lambda a: a != "token_mean")),
              ("the residual min_replace leaves", "cancellation_residual_updates",
               "seq_mean_token_mean / none", "seq_mean_token_mean / min_replace"))
    found = [(what, key, a, b) for what, key, a, b in checks
             if s.get(a, {}).get(key) and s.get(b, {}).get(key)]
    tests = [stats.welch(s[a][key], s[b][key]) for _, key, a, b in found]
    adjusted = stats.holm([t.p if t.p == t.p else 1.0 for t in tests], len(checks))
    out = []
    for (what, key, a, b), t, q in zip(found, tests, adjusted):
        rel = stats.direction(test=t, adjusted_p=q) if t.p == t.p else "n/a (1 seed)"
        out.append(f"{what}: {a} {report.fmt(s[a][key], digits=4)} is {rel}"
                   f" {'than' if rel in ('higher', 'lower') else 'with'} {b}"
                   f" {report.fmt(s[b][key], digits=4)} (Holm p {report.fmt_p(q)})")
    return "Mechanisms: " + "; ".join(out) if out else "mechanisms: no records yet"


def lam_of(label: str) -> float | None:
    """λ of a Table 2b cell ("λ=0.3" -> 0.3; GSPO is λ = 0)."""
    if label == "GSPO":
        return 0.0
    return float(label[2:]) if label.startswith("λ=") else None


def step_time(s: dict[str, dict]) -> str:
    """`scale`: what each variant saves in wall time per step (`report.step_seconds`, each
    seed's median pace), as a Welch difference with its interval and a ratio, over the seeds
    of the host both runs have most seeds on (hosts differ in speed: the reused full runs
    ran on several). A job sharing the cores slows a run too: read with the page's hosts."""
    out = []
    for name, _ in items_recipe.SCALE_VARIANTS:
        for base in ("GSPO", "IBPO-GSPO"):
            a, b = s.get(f"{base} {name}", {}), s.get(base, {})
            shared = set(a.get("step_cpu", [])) & set(b.get("step_cpu", []))
            if not shared:
                continue
            cpu = max(sorted(shared), key=lambda c: (a["step_cpu"] + b["step_cpu"]).count(c))
            xa, xb = ([t for t, c in zip(x["step_s"], x["step_cpu"]) if c == cpu] for x in (a, b))
            t, ma, mb = stats.welch(xa, xb), statistics.mean(xa), statistics.mean(xb)
            interval = "" if t.low != t.low else f" [{t.low:+.2f}, {t.high:+.2f}]"
            out.append(f"{base} {name} {ma:.2f} s vs {mb:.2f} s ({len(xa)} vs {len(xb)} seeds "
                       f"on {cpu}: {ma - mb:+.2f} s{interval}, x{ma / mb:.2f})")
    return "Wall time per step (median pace): " + "; ".join(out) if out else ""


def mixed_groups(ctx: items.ProbeContext) -> list[str]:
    """`recipe`: the share of mixed groups (some right, some wrong: the only ones with a GSPO
    signal and a φ) among the groups each run sampled and among those it trained on. Without
    dynamic sampling the two are one (1 - frac_groups_all_same); with it, the sampled share is
    the mixed groups found over the rounds' groups (1 - groups_filtered / (rounds x B)), and
    the trained batch holds only mixed groups unless the rounds ran out."""
    rows = []
    for r in ctx.item.runs:
        sampled, trained = [], []
        for rec in report.load(ctx.records_dir, r, r.seeds(ctx.seeds)):
            b = rec["config"]["rollout"]["prompts_per_step"]
            steps = [x for x in rec["rows"] if x["step"] > 0 and "frac_groups_all_same" in x]
            if not steps:
                continue
            trained.append(statistics.mean(1 - x["frac_groups_all_same"] for x in steps))
            sampled.append(statistics.mean(
                1 - x["groups_filtered"] / (x["sampling_rounds"] * b) if "groups_filtered" in x
                else 1 - x["frac_groups_all_same"] for x in steps))
        if sampled:
            rows.append(f"| {r.label} | {len(sampled)} | {report.fmt(sampled, 100)} | "
                        f"{report.fmt(trained, 100)} |")
    if not rows:
        return []
    return ["", "## Mixed groups", "", "Share of groups with some right and some wrong answers "
            "(%, mean ± sd over seeds of each run's mean over its logged steps).", "",
            "| run | seeds | of the groups sampled | of the groups trained on |",
            "|---|---|---|---|", *rows]
