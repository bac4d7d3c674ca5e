"""What some items add to their report (hooks named in experiments/items.py): sentences for
the verdict line (`notes`), read from the per-run summaries (`report.summarize`: run label ->
{"final": [a value per seed], metric: [...], ...}; "" when their runs have no records yet),
and where Table 2b's final-accuracy panel places each run (`FinalsAxis`)."""

from __future__ import annotations

import statistics

from experiments import items, report, stats


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
                for agg in sorted(items.CLIP_HIGHER_ON, key=lambda a: a != "token_mean")),
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
