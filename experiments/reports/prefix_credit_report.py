"""The results page of the `prefix_credit` probe (experiments/probes/prefix_credit.py, issue #47):
prefix_credit.md / .json / .png from the per-seed records, without sampling again."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np

from experiments.probes import prefix_classes as terms
from experiments.probes import prefix_rules

# The hypothesis holds where its premise does (more than MOST of the wrong responses'
# right-prefix tokens lie on a node a correct peer shares: elsewhere no peer is there to cancel
# GSPO's penalty), under GSPO more than MOST of the shared right-prefix nodes already carry net
# weight >= 0, and terms.SHARE of IBPO's change lies on at most SMALL of the response tokens
# (sequence credit, the paper's form).
MOST, SMALL = 0.5, 0.2
RULE = (f"The hypothesis's premise: more than {100 * MOST:.0f} % of the wrong responses' "
        "right-prefix tokens lie on a node a correct peer shares (only there can the peers "
        "cancel GSPO's penalty); where it fails, the hypothesis does not hold on the task. "
        "Where it holds, the hypothesis holds where, under GSPO, more than "
        f"{100 * MOST:.0f} % of the shared right-prefix nodes already carry net weight >= 0 "
        f"and {100 * terms.SHARE:.0f} % of IBPO's change (sequence credit) lies on at most "
        f"{100 * SMALL:.0f} % of the response tokens. The cut-offs ({MOST} / {SMALL}) were "
        "set after the `arith` data had been seen, and the premise check was added after the "
        "first `countdown` result: descriptive cut-offs, not a test fixed in advance.")


def policies(recs: list[dict]) -> dict[str, list[dict]]:
    """The parts of the records by policy: the base, then each final policy's held-out part."""
    out = {"base policy": [r["base_policy"] for r in recs]}
    for label in terms.RUNS:
        if got := [r["trained"][label] for r in recs if r.get("trained")]:
            out[f"{label} final, held out"] = got
    return out


def _ci(xs: list[float], scale: float = 100.0, digits: int = 1, share: bool = True) -> str:
    """mean [95 % t-interval] over seeds (the mean alone for one seed, — for none); a share's
    interval is cut to [0, 100] %."""
    if not xs:
        return "—"
    m = statistics.mean(xs) * scale
    if len(xs) < 2:
        return f"{m:.{digits}f}"
    from scipy import stats as sp  # in .venv as a dependency of jax

    h = sp.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) * scale / len(xs) ** 0.5
    lo, hi = (max(m - h, 0.0), min(m + h, scale)) if share else (m - h, m + h)
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _frac(a: str, b: str) -> Callable[[dict], float]:
    return lambda p: p["counts"][a] / max(p["counts"][b], 1)


SHARING = (  # (column, per-part value, percent?)
    ("mixed groups / batch", _frac("mixed_groups", "batches"), False),
    ("right-prefix tokens / wrong response", _frac("right_tokens", "wrong_scored"), False),
    ("right-prefix tokens a correct peer shares (%)", _frac("right_shared", "right_tokens"),
     True),
    ("same, by the checker's lines (%)", _frac("right_shared_step", "right_tokens_step"), True),
    ("shared by every correct peer (%)", _frac("right_shared_all", "right_tokens"), True),
    ("wrong responses with an unshared right token (%)",
     _frac("wrong_with_unshared", "wrong_scored"), True),
    ("distinct {solutions} / mixed group", _frac("distinct_correct", "mixed_groups"), False),
    ("groups with no right response / batch", _frac("no_right_groups", "batches"), False),
    ("right-prefix tokens of wrong responses there (% of all)", lambda p: p["counts"][
        "right_tokens_no_right"] / max(p["counts"]["right_tokens_no_right"]
                                       + p["counts"]["right_tokens"], 1), True))


CLASS_COLUMNS = ("policy", "node class", "nodes / seed", "members (right ones)",
                 "shared by the whole group (%)", "GSPO: net >= 0 (%)",
                 "GSPO: net >= 0, other nodes (%)", "GSPO: median [q25, q75]", *(
                     f"{terms.CREDIT_LABELS[c]}: {x}" for c in ("ibpo_seq", "ibpo_token")
                     for x in ("net >= 0 (%)", "Σ|Δ| / Σ|GSPO| (%)", "share of all Σ|Δ| (%)")))


def _class_rows(name: str, parts: list[dict]) -> list[str]:
    """One row per node class of one policy's parts (cells: mean [95 % interval] over seeds)."""
    rows = []
    for c, label in zip(terms.CLASSES, terms.CLASS_LABELS):
        es = [p["classes"][c] for p in parts if p["classes"][c]["nodes"]]
        if not es:
            rows.append(f"| {name} | {label} | 0 |" + " — |" * (len(CLASS_COLUMNS) - 3))
            continue
        mean = lambda f: statistics.mean(f(e) for e in es)  # noqa: E731
        q = [mean(lambda e, i=i: e["gspo"]["q"][i]) for i in (2, 1, 3)]
        cells = [f"{mean(lambda e: e['nodes']):.0f}",
                 f"{mean(lambda e: e['members']):.2f} ({mean(lambda e: e['right_members']):.2f})",
                 _ci([e["whole"] for e in es]), _ci([e["gspo"]["ge0"] for e in es]),
                 _ci([e["gspo_partial"]["ge0"] for e in es if e["gspo_partial"]["n"]]),
                 f"{q[0]:.2f} [{q[1]:.2f}, {q[2]:.2f}]"]
        for cred in ("ibpo_seq", "ibpo_token"):
            cells += [_ci([e[cred]["ge0"] for e in es]),
                      _ci([e[f"change_{cred}"]["rel"] for e in es], share=False),
                      _ci([e[f"change_{cred}"]["share"] for e in es])]
        rows.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    return rows


def verdict(parts: list[dict]) -> dict:
    """The issue's test on one policy's parts (seed means): `shared`, the share of the wrong
    responses' right-prefix tokens a correct peer shares (`premise`: over MOST); `a_ge0`, the
    share of shared right-prefix nodes whose GSPO net weight is >= 0; `b_lt0`, of unshared ones
    whose net weight is < 0; `tokens_<credit>`, the share of response tokens on the fewest nodes
    carrying terms.SHARE of IBPO's change; `holds` (RULE)."""
    mean = lambda f: statistics.mean(f(p) for p in parts)  # noqa: E731
    a = lambda p: p["classes"]["shared"]  # noqa: E731
    b = lambda p: p["classes"]["unshared"]["gspo"]  # noqa: E731
    shared = mean(lambda p: p["counts"]["right_shared"] / max(p["counts"]["right_tokens"], 1))
    out = {"shared": shared, "premise": shared > MOST,
           "b_lt0": mean(lambda p: 1.0 - b(p)["ge0"] if b(p)["n"] else 0.0),
           "a_ge0": mean(lambda p: a(p)["gspo"].get("ge0", 0.0)),
           "a_whole": mean(lambda p: a(p)["whole"]),
           "a_partial": mean(lambda p: a(p)["gspo_partial"].get("ge0", 0.0))}
    for cred in ("ibpo_seq", "ibpo_token"):
        out[f"tokens_{cred}"] = mean(lambda p, c=cred: p["concentration"][c]["tokens"])
        out[f"nodes_{cred}"] = mean(lambda p, c=cred: p["concentration"][c]["nodes"])
    out["holds"] = out["premise"] and out["a_ge0"] > MOST and out["tokens_ibpo_seq"] <= SMALL
    return out


def _measured(name: str, parts: list[dict], rule: prefix_rules.Rule) -> str:
    v = verdict(parts)
    c = lambda key: statistics.mean(p["counts"][key[0]] / max(p["counts"][key[1]], 1)  # noqa
                                    for p in parts)
    texts = (f" ({c(('distinct_correct_text', 'mixed_groups')):.2f} distinct texts)"
             if rule.note and all("distinct_correct_text" in p["counts"] for p in parts) else "")
    no_peer = (f"the hypothesis does not hold on this task: most right-prefix tokens "
               f"({100 * (1 - v['shared']):.1f} %) have no correct peer sharing them, and there, "
               f"under GSPO, {100 * v['b_lt0']:.1f} % of the unshared right-prefix nodes carry "
               "net weight < 0: exactly the situation IBPO targets")
    end = ("the hypothesis holds" if v["holds"] else
           "the hypothesis does not hold" if v["premise"] else no_peer)
    return (f"{name}: {100 * v['shared']:.1f} % of the wrong responses' "
            f"right-prefix tokens lie on a node a correct peer shares "
            f"({100 * c(('right_shared_all', 'right_tokens')):.1f} % on one every correct peer "
            f"shares; {c(('distinct_correct', 'mixed_groups')):.2f} distinct {rule.solutions_are}"
            f"{texts} per mixed group); under GSPO {100 * v['a_ge0']:.1f} % of the shared "
            f"right-prefix nodes already carry net weight >= 0 ({100 * v['a_whole']:.1f} % of "
            f"them are shared by the whole group; {100 * v['a_partial']:.1f} % of the others "
            f"carry >= 0); {100 * terms.SHARE:.0f} % of IBPO's change lies on "
            f"{100 * v['tokens_ibpo_seq']:.1f} % of the response tokens "
            f"({100 * v['nodes_ibpo_seq']:.1f} % of the nodes) with sequence credit, "
            f"{100 * v['tokens_ibpo_token']:.1f} % ({100 * v['nodes_ibpo_token']:.1f} %) with "
            f"token credit: {end}")


def write(recs: list[dict], *, out_dir: Path, command: str, records_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    rules = {r.get("rule", "arith") for r in recs}  # (records before countdown name none)
    if len(rules) != 1:
        raise ValueError(f"prefix_credit: records of several rules {sorted(rules)}")
    rule = prefix_rules.rule_for(rules.pop())
    by_policy = policies(recs)
    trained = [r["trained"] for r in recs if r.get("trained")]
    runs = (f"held-out batches (evaluation prompts, {trained[0]['batches']} per seed) of the "
            f"final (step {trained[0]['step']}) GSPO and IBPO-GSPO policies of run seeds "
            f"{', '.join(str(t['run_seed']) for t in trained)} (one per probe seed)"
            if trained else "no final GSPO / IBPO-GSPO checkpoints yet: no trained part")
    other = sorted({f"{t[label]['run_base']}" for r in recs if (t := r.get("trained"))
                    for label in terms.RUNS if t[label]["run_base"] != r["base"]})
    if trained:  # the runs must have started from the base the probe samples
        runs += (f"; their base is not the probe's: {', '.join(other)}" if other else
                 ", trained from the same base")
    lines = ["# Prefix credit: do correct peers already pay for a wrong response's right "
             "prefix? (issue #47)", "",
             f"Produced by `{command}` from the records in `{records_dir.name}/` "
             f"(`prefix_credit_s*.json`; `experiments/probes/prefix_credit.py` says what is "
             f"measured and how). Nothing is trained: {recs[0]['batches']} rollout batches per "
             f"seed of the committed base, {len(recs)} seed(s); {runs}. Cells: mean over seeds "
             "[95 % t-interval]. Only groups with right and wrong responses count (elsewhere "
             f"every advantage is 0).{' ' + rule.note if rule.note else ''}", "",
             "## Who shares a wrong response's right prefix", "",
             "| policy | seeds | " + " | ".join(c.format(solutions=rule.solutions_are)
                                               for c, _, _ in SHARING) + " |",
             "|---|---|" + "---|" * len(SHARING)]
    for name, parts in by_policy.items():
        lines.append(f"| {name} | {len(parts)} | " + " | ".join(
            _ci([f(p) for p in parts], 100.0 if pct else 1.0, 1 if pct else 2, share=pct)
            for _, f, pct in SHARING) + " |")
    lines += ["", "## Net update weight Σ A·w per node, in advantage units", "",
              "Σ|Δ|: IBPO's change of the net weight against GSPO on the same trajectories.", "",
              "| " + " | ".join(CLASS_COLUMNS) + " |", "|" + "---|" * len(CLASS_COLUMNS)]
    for name, parts in by_policy.items():
        lines += _class_rows(name, parts)
    measured = [_measured(name, parts, rule) for name, parts in by_policy.items()]
    from experiments.reports import report  # (report does not import the probes)

    probes = {"prefix_credit": recs + trained}
    lines += ["", "## Verdict", "", RULE, "",
              *(f"**Measured**, {m}." for m in measured), "",
              f"Code (commit of each record and trained part): {report.code_versions(probes)}.",
              "", f"Hosts: {report.hosts(probes)}.", "", "![prefix_credit](prefix_credit.png)",
              "", f"*Net update weight per node (advantage units, clipped to "
              f"±{terms.EDGES[-1]:g}), by class, summed over {len(recs)} seed(s): the share of "
              "the class's nodes per bin, log scale; GSPO and IBPO on the same trajectories.*"]
    md, js, png = (out_dir / f"prefix_credit.{x}" for x in ("md", "json", "png"))
    md.write_text("\n".join(lines) + "\n")
    base = verdict(by_policy["base policy"])
    js.write_text(json.dumps({"verdict": "holds" if base["holds"] else "does not hold",
                              "why": measured[0], "seeds": len(recs),
                              "run_seeds": [t["run_seed"] for t in trained]}) + "\n")
    _plot(by_policy, png)
    return [md, js, png]


def _plot(by_policy: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, classes = list(by_policy), terms.CLASSES[:3]
    fig, axes = plt.subplots(len(rows), len(classes), figsize=(11, 2.6 * len(rows)),
                             squeeze=False, sharex=True)
    styles = {"gspo": ("black", "-"), "ibpo_seq": ("#0072B2", "--"),
              "ibpo_token": ("#E69F00", ":")}
    for r, name in enumerate(rows):
        for c, cls in enumerate(classes):
            ax = axes[r][c]
            for cred in terms.CREDITS:
                counts = np.sum([p["hist"][cls][cred] for p in by_policy[name]], axis=0)
                if counts.sum():
                    color, ls = styles[cred]
                    ax.stairs(counts / counts.sum(), terms.EDGES, color=color, linestyle=ls,
                              label=terms.CREDIT_LABELS[cred])
                elif cred == "gspo":
                    ax.text(0.5, 0.5, "no nodes", transform=ax.transAxes, ha="center")
            ax.set_yscale("log")
            ax.set_ylim(1e-4, 1.5)
            ax.axvline(0, color="grey", lw=0.5)
            ax.set_title(f"{name}: {terms.CLASS_LABELS[terms.CLASSES.index(cls)]}", fontsize=8)
            if r == len(rows) - 1:
                ax.set_xlabel("net weight Σ A·w (advantage units)")
    axes[0][0].set_ylabel("share of the class's nodes")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
