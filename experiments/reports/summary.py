"""The summary table, experiments/results/README.md: each item's verdict per task, and the rule
those verdicts follow (experiments/reports/stats.py, report.verdict_word), stated once for every
item."""

from __future__ import annotations

import json
from pathlib import Path

from experiments import items_registry

RULE = """\
## The rule

Every verdict follows one rule (`experiments/reports/stats.py`, `experiments/reports/report.py`):

- **A comparison** is a contrast of seed means the paper says goes one way: a run against
  another (final held-out accuracy unless named), C.1's gain at one size against the gain at
  the other, or Appendix A's per-seed mean against a constant (Cov(Y, φ) against 0, the
  PG-variance ratio against 1). Each report lists its item's comparisons with the difference
  d, its 95 % interval d ± t₀.₉₇₅,ν·se, and Welch's two-sided p, where
  se² = Σ cᵢ² sᵢ² / nᵢ over the contrast's runs (coefficient cᵢ, seed sd sᵢ, nᵢ seeds: runs
  may have different seed counts) and ν is Welch–Satterthwaite's
  se⁴ / Σ (cᵢ² sᵢ² / nᵢ)² / (nᵢ − 1).
- **Holm within the item**: the p-values of an item's comparisons are Holm-adjusted over the
  item's n comparisons (those without 2 seeds on every side yet count as the largest, so an
  adjusted p can only fall as they come in). "higher" / "lower" needs adjusted p < 0.05;
  anything else is **level**, reported with the smallest effect the seeds detect,
  MDE = (t₀.₉₇₅,ν′ + t₀.₈,ν′) · s_p · √(Σ cᵢ² / nᵢ), with s_p the sd pooled over the
  contrast's runs and ν′ Welch's df at equal sds: two-sided α = 0.05, power 0.8, the usual t
  approximation of the noncentral t. It is at the unadjusted α: Holm asks more of the first
  comparisons of a family (α / n), so a true effect of this size can still come out level.
  A "level" says the seeds cannot tell the runs apart, not that they are equal.
- **An item's verdict** counts its comparisons: k go the paper's way (significant, in the
  paper's direction), m against it (significant, the other way), the rest level. The word is
  a function of (k, m, n) alone: for an "every comparison" claim, **holds** if k = n,
  **partly** if 0 < k < n, **does not hold** if k = 0 < m, **not shown** if k = m = 0 (every
  comparison level); for a "some comparison" claim (`variants`), holds if k ≥ 1, else does
  not hold (m ≥ 1) or not shown. The cell shows the word with its counts, "partly (1/4 for,
  1 against)". While a comparison lacks 2 seeds on a side the item is **incomplete**, unless
  the missing ones cannot change its word.
- **Shared runs**: items reuse runs (the GSPO and IBPO-GSPO default runs serve Table 2a,
  Table 2b, C.2, §4.2, C.1, C.3, C.4, Appendix A, `variants`, `recipe` and `scale`), and the
  same comparison on the same records (IBPO-GSPO vs GSPO) is counted in several items; each
  report names the items it shares runs and comparisons with. The items' verdicts are therefore not
  independent evidence, and Holm corrects within an item, not across the table.
- **Provenance**: each record names its code (`commit`, `dirty`) and host (`cpu`); records
  written before that are back-filled by `python -m experiments.reports.provenance` with the parent
  of the commit that added their values (`commit_source` says so; `dirty` null: unknown).
  Reports list the commits behind their records and any truncated record; where a two-run
  comparison's records span hosts, the effect on each host's seeds alone and whether the hosts
  disagree (issue 57: on `arith_long` the headline pair's AMD and Intel seeds do).
- **Paired items** (`oracle`, issue 57) train seed s of every arm on one host at one commit,
  back to back, from a clean tree, in records of their own (`runs/<task>/paired/`), and compare
  arms on the per-seed differences: paired t with n − 1 df, its 95 % interval, Holm within the
  item, and the detectable effect (t₀.₉₇₅ + t₀.₈) · sd(d) / √n. A seed whose arms differ in
  commit or host, or come from a dirty tree, is left out of every pair, and seeds of more than
  one commit are not paired at all; the page says which.
"""
JUDGED = ("holds", "partly", "does not hold", "not shown")


def word_of(verdict: str) -> str:
    """The verdict's word without its counts: "partly (1/4 for, 1 against)" -> "partly"."""
    return verdict.split(" (")[0]


def overall(verdicts: dict[str, str]) -> str:
    """The summary's "holds here?" from each task's verdict (task -> verdict or "not run yet")."""
    short = {t: word_of(v) if word_of(v) in JUDGED else "" for t, v in verdicts.items()}
    pending = [t for t, v in verdicts.items()
               if v == "not run yet" or v.startswith("incomplete") or "(so far" in v]
    if pending:
        return "not yet: " + ", ".join(f"`{t}`" for t in pending) + " to run"
    if not all(short.values()):  # a probe's figure, "mixed bases": read them
        return "see the cells"
    kinds = set(short.values())
    if kinds == {"holds"}:
        return "**yes**" + (" (both tasks)" if len(short) > 1 else "")
    if kinds == {"does not hold"}:
        return "**no**" + (" (neither task)" if len(short) > 1 else "")
    if kinds == {"not shown"}:
        return "not shown" + (" on either task" if len(short) > 1 else "")
    if kinds == {"holds", "does not hold"}:
        return "only on " + ", ".join(f"`{t}`" for t, v in short.items() if v == "holds")
    if "holds" in kinds or "partly" in kinds:
        return "partly"
    return "no or not shown"


def write_summary(out: Path, tasks: tuple[str, ...]) -> Path:
    """<out>/README.md: paper claim | one column per task | holds?"""
    lines = ["# Reproduction in miniature: which claims hold here", "",
             "Generated by `python -m experiments.reproduce ITEM` from the committed records; "
             "each cell links the item's results file. Every run starts from the committed "
             "base of its task (`experiments/warm_starts/`); results on the earlier, "
             "uncommitted bases are in [legacy/](legacy/README.md). Each cell: the verdict "
             "word and its counts (comparisons for the paper / against it, of n); the rule "
             "is below the table.", "",
             "| item | paper claim | " + " | ".join(f"on `{t}`" for t in tasks)
             + " | holds here? |",
             "|---|---|" + "---|" * len(tasks) + "---|"]
    for name, item in items_registry.ITEMS.items():
        verdicts = {t: _verdict(out, t, name) for t in tasks}
        cells = [v if v in UNLINKED else f"[{v}]({t}/{name}.md)" for t, v in verdicts.items()]
        judged = {t: v for t, v in verdicts.items() if v != NOT_PLANNED}
        lines.append(f"| {item.title} | {item.claim} | " + " | ".join(cells)
                     + f" | {overall(judged)} |")
    lines += ["", RULE]
    out.mkdir(parents=True, exist_ok=True)  # a new --out with no records yet
    path = out / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


NOT_PLANNED = "not planned"
UNLINKED = ("not run yet", NOT_PLANNED)


def _verdict(out: Path, task: str, name: str) -> str:
    """Item `name`'s verdict on `task` from its report, or why there is none."""
    if not items_registry.ITEMS[name].planned(task):
        return NOT_PLANNED
    js = out / task / f"{name}.json"
    return json.loads(js.read_text())["verdict"] if js.exists() else "not run yet"


BEGIN, END = "<!-- VERDICT TABLE -->", "<!-- /VERDICT TABLE -->"


def front_page_table(out: Path, tasks: tuple[str, ...], *, link_prefix: str) -> list[str]:
    """The verdict table of the repository's front page: item | one column per task, each
    cell the verdict word and counts linking the item's report (`link_prefix` + task/item.md).
    Generated from the same reports as the summary, so the front page cannot drift from them."""
    lines = ["| item | " + " | ".join(f"`{t}`" for t in tasks) + " |",
             "|---|" + "---|" * len(tasks)]
    for name, item in items_registry.ITEMS.items():
        cells = []
        for t in tasks:
            v = _verdict(out, t, name)
            cells.append(v if v in UNLINKED else f"[{v}]({link_prefix}{t}/{name}.md)")
        lines.append(f"| {item.title} | " + " | ".join(cells) + " |")
    return lines


def sync_front_page(readme: Path, out: Path, tasks: tuple[str, ...], *, link_prefix: str
                    ) -> bool:
    """Rewrites the block between BEGIN and END in `readme` with `front_page_table`; returns
    whether the file has that block (a README without it is left alone)."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    table = "\n".join(front_page_table(out, tasks, link_prefix=link_prefix))
    readme.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    return True
