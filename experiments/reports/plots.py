"""Each item's figure: held-out accuracy over training, the item's own per-step metrics, and
the final accuracy per run beside the paper's numbers.

Readable in grey: each run keeps one colour, line style and marker on every panel of its item
(Okabe-Ito colours, which stay distinct for colour-blind readers). A panel holds at most
`PER_PANEL` runs: more are split over panels, each beside the item's first run (its baseline).
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import numpy as np

from experiments import items as items_lib

PER_PANEL = 5
COLOURS = ("#000000", "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9",
           "#882255")  # Okabe-Ito without its pale yellow, + wine
LINES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
# y-axis labels with units (accuracy is plotted in %, as in the tables).
UNITS = {
    "eval_accuracy": "held-out accuracy (%)",
    "reward_mean": "mean training reward (1 = correct)",
    "reward_var": "training reward variance (reward²)",
    "cov_y_phi": "Cov(Y, φ) (reward × φ)",
    "pg_var_ratio": "PG variance, variant / GSPO (ratio)",
    "pg_noise_ratio": "PG variance / ‖mean grad‖² (ratio)",
    "pg_noise_ratio_gspo": "GSPO's PG variance / ‖mean grad‖² (ratio)",
    "lambda_max": "λ_max = 2 Cov(R, φ) / Var(φ)",
    "first_error_agreement": "first-error agreement (fraction)",
    "adv_sign_flip_frac": "advantages flipped in sign (fraction)",
    "adv_mass_before_error": "advantage mass before the first error (fraction)",
    "grad_share_before_error": "gradient share before the first error (fraction)",
    "grad_share_before_error_gspo": "GSPO's gradient share before the error (fraction)",
    "cancellation_residual": "cancellation residual, before the update (ratio)",
    "cancellation_residual_updates": "cancellation residual, at the ratios (ratio)",
    "shared_logprob_drift": "shared-prefix log-prob drift (nats)",
    "shared_logprob_drift_whole": "whole-group shared-prefix drift (nats)",
    "entropy": "policy entropy (nats / token)",
    "frac_groups_all_same": "all-same groups in the trained batch (fraction)",
    "groups_filtered": "groups dynamic sampling dropped (per step)",
    "sampling_rounds": "sampling rounds (per step)",
    "phi_mean": "φ (mean over scored wrong responses)",
    "policy_lag": "policy lag of the rollouts (steps)",
}
# Reference lines: (value, what) per key; 1.0 for ratios of IBPO to GSPO, the paper's 0.70.
REFERENCES = {
    "pg_var_ratio": ((1.0, "1.0: as GSPO"), (0.70, "paper: 0.70")),
    "cov_y_phi": ((0.0, "0: the paper's sign boundary"),),
}
SHOWN_AS = {"SCoRe+GRPO": "SCoRe+GRPO (2nd attempt)"}  # its scored answer is the second


def style(i: int) -> dict:
    """The i-th run's colour, line style and marker: black solid for the first run (the
    baseline) alone; neighbours differ in line style, and no two of the first 28 runs share
    colour and line style."""
    colour = COLOURS[0] if i == 0 else COLOURS[1 + (i - 1) % (len(COLOURS) - 1)]
    return {"color": colour, "ls": LINES[i % len(LINES)], "marker": MARKERS[i % len(MARKERS)]}


def panels_of(labels: list[str], *, pairs: list[tuple[str, str]] = (),
              per_panel: int = PER_PANEL) -> list[list[str]]:
    """The runs split into panels of at most `per_panel`. When the compared `pairs` are
    disjoint and cover every run (C.3, C.4: each IBPO beside its base), whole pairs share a
    panel; otherwise each panel has the first run (the baseline) beside the others."""
    if len(labels) <= per_panel:
        return [labels]
    blocks: list[list[str]] = []
    for a, b in pairs:
        if not any(a in x or b in x for x in blocks) and {a, b} <= set(labels):
            blocks.append([b, a])  # the baseline first
    if sorted(x for block in blocks for x in block) == sorted(labels):
        size = per_panel // 2 * 2
        return [sum(blocks[i:i + size // 2], []) for i in range(0, len(blocks), size // 2)]
    first, rest = labels[0], labels[1:]
    n = -(-len(rest) // (per_panel - 1))  # as few panels as fit, filled evenly
    cuts = [round(i * len(rest) / n) for i in range(n + 1)]
    return [[first, *rest[a:b]] for a, b in zip(cuts, cuts[1:])]


def _paper_number(text: str) -> float | None:
    """The paper's accuracy in a `paper` cell ("36.7 (best)" -> 36.7; "400 steps" -> None)."""
    head = text.split(" ")[0]
    return float(head) if re.fullmatch(r"\d+\.\d+", head) else None


def plot_item(item: items_lib.Item, *, data: dict[str, list[dict]], summaries: dict[str, dict],
              path: Path) -> str:
    """Draws the item's figure to `path`; returns its caption."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [label for label, recs in data.items() if recs]
    styles = {label: style(i) for i, label in enumerate(data)}
    by_budget = "budget_trajectories" in item.metrics  # methods stop at different steps
    keys = ("eval_accuracy", *(k for k in item.metrics if k != "budget_trajectories" and any(
        k in row for recs in data.values() for rec in recs for row in rec["rows"])))
    groups = [g for p in item.panels if (g := [x for x in p if x in labels])] or panels_of(
        labels, pairs=[tuple(c.labels) for c in item.comparisons
                       if len(c.terms) == 2 and len(set(c.labels)) == 2])
    papers = {label: p for label in labels
              if (p := _paper_number(item.paper.get(label, ""))) is not None}
    final_panel = len(papers) >= 2 or item.finals_axis is not None
    panels, cols = _layout(keys, groups, final_panel)
    rows = -(-len(panels) // cols)
    width = 4.8 * cols
    fig, axes = plt.subplots(rows, cols, figsize=(width, 3.5 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels):
        if panel is None:
            _finals(ax, item, labels, summaries, papers, styles)
        elif not panel[0]:
            ax.set_visible(False)
        else:
            _curves(ax, *panel, data=data, styles=styles, by_budget=by_budget)
    caption = _caption(item, labels, keys, by_budget=by_budget, final_panel=final_panel)
    # The caption under the panels, in the room its lines take (7 pt lines, ~0.13 in each).
    text = _wrap(caption, int(width * 17))
    extra = 0.13 * (text.count("\n") + 1) + 0.15
    fig.set_figheight(3.5 * rows + extra)
    fig.suptitle(item.title, fontsize=10)
    fig.tight_layout(rect=(0, extra / fig.get_figheight(), 1, 0.97))
    fig.text(0.01, 0.01, text, fontsize=7, va="bottom")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return caption


def _layout(keys: tuple[str, ...], groups: list[list[str]], final_panel: bool
            ) -> tuple[list[tuple[str, list[str]] | None], int]:
    """The panels, as (key, runs) or None for the final-accuracy panel, and the columns: with
    the runs split over several panels, a row per key (the final panel closes the first);
    else the panels flow in rows of 3."""
    panels: list[tuple[str, list[str]] | None] = []
    if len(groups) > 1:
        cols = len(groups) + final_panel
        for key in keys:
            panels += [(key, g) for g in groups]
            panels += [None if key == keys[0] else ("", [])] * final_panel
        return panels, cols
    panels = [(keys[0], groups[0]), *([None] * final_panel),
              *((k, groups[0]) for k in keys[1:])]
    return panels, min(3, len(panels))


def _curves(ax, key: str, group: list[str], *, data: dict[str, list[dict]],
            styles: dict[str, dict], by_budget: bool) -> None:
    """One panel: `key` over training for each run of `group`, with its reference lines."""
    scale = 100.0 if key == "eval_accuracy" else 1.0
    for label in group:
        _series(ax, data[label], key, scale=scale, by_budget=by_budget,
                label=f"{SHOWN_AS.get(label, label)} (n={len(data[label])})", **styles[label])
    for value, what in REFERENCES.get(key, ()):
        ax.axhline(value, color="grey", lw=0.9, ls=":" if value != 1.0 else "-")
        ax.annotate(what, (0.01, value), xycoords=("axes fraction", "data"),
                    fontsize=7, color="dimgrey", va="bottom")
    ax.set_ylabel(UNITS.get(key, key), fontsize=8)
    ax.set_xlabel("trajectories sampled (budget)" if by_budget else "RL step", fontsize=8)
    if ax.get_legend_handles_labels()[0]:  # a metric no seed of these runs logs: none
        ax.legend(fontsize=6.5)
    ax.grid(alpha=0.3)


def _caption(item: items_lib.Item, labels: list[str], keys: tuple[str, ...], *,
             by_budget: bool, final_panel: bool) -> str:
    spread = ("each line is one seed (the runs stop at their budget, not at a common step)"
              if by_budget else "lines are seed means, bands ±1 sd over each run's n seeds "
              "(n in the legend)")
    return (f"{item.title}. Held-out accuracy in %; {spread}."
            + (" The last panel: final accuracy, mean ± 1 sd over seeds (error bars), "
               "with the paper's number on its own benchmark (hollow grey diamonds, right "
               "axis): compare the shapes, not the levels." if final_panel else "")
            + (" SCoRe+GRPO's line is its second attempt (the scored answer)."
               if "SCoRe+GRPO" in labels else "")
            + (" Dotted grey: the paper's 0.70 PG-variance ratio; solid grey: 1.0 (as "
               "GSPO)." if "pg_var_ratio" in keys else ""))


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def _series(ax, recs: list[dict], key: str, *, scale: float, by_budget: bool, label: str,
            color: str, ls: str, marker: str) -> None:
    if by_budget:  # each seed's evaluations against the budget it had spent
        for k, rec in enumerate(recs):
            rows = [row for row in rec["rows"] if key in row]
            ax.plot([row.get("budget_trajectories", 0) for row in rows],
                    [scale * row[key] for row in rows], color=color, ls=ls, marker=marker,
                    ms=3, alpha=0.8, label=label if k == 0 else None)
        return
    series = [{row["step"]: row[key] for row in rec["rows"] if key in row} for rec in recs]
    series = [x for x in series if x]  # seeds that log the key
    steps = sorted(set.intersection(*(set(x) for x in series))) if series else []
    if not steps:
        return
    v = scale * np.array([[x[t] for t in steps] for x in series])
    m, sd = v.mean(0), v.std(0, ddof=1) if len(v) > 1 else np.zeros(len(steps))
    ax.plot(steps, m, color=color, ls=ls, marker=marker if len(steps) <= 25 else None, ms=3,
            label=label)
    ax.fill_between(steps, m - sd, m + sd, color=color, alpha=0.15, lw=0)


def _finals(ax, item: items_lib.Item, labels: list[str], summaries: dict[str, dict],
            papers: dict[str, float], styles: dict[str, dict]) -> None:
    """Final accuracy per run (mean ± 1 sd), the paper's numbers on a twin axis; against the
    item's `finals_axis` if it has one (Table 2b: λ, the paper's Fig. 2)."""
    axis = item.finals_axis
    on_axis = axis is not None  # a curve through the runs on the item's axis
    xs = {label: (axis.position(label) if on_axis else i) for i, label in enumerate(labels)}
    for label in labels:
        f = [100 * x for x in summaries[label]["final"]]
        sd = statistics.stdev(f) if len(f) > 1 else 0.0
        st = styles[label]
        ax.errorbar(xs[label], statistics.mean(f), yerr=sd, color=st["color"],
                    marker=st["marker"], capsize=3, ls="none",
                    label="ours, mean ± 1 sd (left axis)" if label == labels[0] else None)
    if on_axis:  # the curve through the cells
        pts = sorted((xs[label], 100 * statistics.mean(summaries[label]["final"]))
                     for label in labels)
        ax.plot(*zip(*pts), color="black", lw=0.8)
        ax.set_xlabel(axis.label, fontsize=8)
    else:
        ax.set_xticks(list(xs.values()), [SHOWN_AS.get(x, x) for x in labels], rotation=30,
                      ha="right", fontsize=7)
    ax.margins(x=0.08, y=0.12)  # the error bars' caps inside the frame
    ax.set_ylabel("final held-out accuracy (%), ours", fontsize=8)
    ax.grid(alpha=0.3)
    if papers:
        twin = ax.twinx()
        pts = [(xs[label], p) for label, p in papers.items() if xs[label] is not None]
        twin.plot(*zip(*sorted(pts)), ls=":" if on_axis else "none", color="grey", marker="D",
                  mfc="none", ms=6, label="paper (right axis)")
        lines = ax.get_legend_handles_labels()
        more = twin.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=6.5, loc="lower left")
        twin.set_ylabel("paper's accuracy (%), its benchmark", fontsize=8, color="dimgrey")
        lo, hi = min(p for _, p in pts), max(p for _, p in pts)
        pad = max(1.0, (hi - lo) * 0.3)
        twin.set_ylim(lo - pad, hi + pad if not math.isnan(hi) else None)
    ax.set_title("final accuracy (mean ± 1 sd)" + (f" vs {axis.name}" if on_axis else ""),
                 fontsize=9)
