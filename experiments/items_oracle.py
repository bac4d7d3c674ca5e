"""Issue 57's item, `oracle`: what would perfect credit buy? (experiments/items.py says what an
item is.)

IBPO ends level with GSPO on every task here, which two explanations fit: (a) the credit is
wrong (on `countdown` φ's first error is the checker's first wrong step for 38 % of the wrong
responses), or (b) shaping a terminal reward by partial credit does not help GSPO at all (on
`arith`, where φ finds it 91 % of the time, IBPO is level too). The embedded checkers know the
first wrong step, so φ can be given the truth (`ibpo.operator = "checker"`): if even oracle
credit is level with GSPO, (b); if it gains where IBPO does not, (a).

A paired design (`Item.paired`): every arm's seed s trains on one host at one commit, back to
back, in its own records (runs/<task>/paired/: the older records of GSPO and IBPO-GSPO pool
hosts and commits, issue 57), and each arm is compared with GSPO on the per-seed differences
(experiments/reports/paired.py). Its page is written by `experiments.reports.paired:probe`.
An arm added later trains at its own commit and pairs with the others where a rerun of one of
their seeds there reproduces its record exactly (experiments/reports/reuse.py): so
`vouched_steps`, at 5ef10f5, with `countdown`'s GSPO of b17d861.
"""

from __future__ import annotations

import dataclasses

from experiments.items import NO_CLAIM, Item, Lazy, run

ORACLE_SEEDS = 8
GSPO = run("GSPO", "gspo")
IBPO = run("IBPO-GSPO", "ibpo_gspo")  # the paper's operator, lcs_first_error
ORACLE_SEQ = run("oracle, sequence", "ibpo_gspo", **{"ibpo.operator": "checker"})
ORACLE_TOKEN = run("oracle, token", "ibpo_gspo",
                   **{"ibpo.operator": "checker", "ibpo.credit": "token"})
# Issue 57's non-oracle operator: the first step no correct peer took, in the task's canonical
# form (countdown: commutative operands sorted). Trained where right paths differ.
PEER_STEPS = dataclasses.replace(run("peer_steps", "ibpo_gspo",
                                     **{"ibpo.operator": "peer_steps"}), tasks=("countdown",))
# Issue 57's checker-free operator that walks the first error forward while a policy continuation
# of the step's prefix is judged right. Its continuations count in the budget (4.5x a step's
# rollouts on countdown), so it is read twice: at GSPO's steps, and stopped at GSPO's budget
# (200 steps x 256 rollouts; the stop overshoots by less than one step).
GSPO_BUDGET = 200 * 256
VOUCHED = dataclasses.replace(run("vouched_steps", "ibpo_gspo",
                                  **{"ibpo.operator": "vouched_steps"}), tasks=("countdown",))
VOUCHED_BUDGET = dataclasses.replace(
    run("vouched_steps, GSPO's budget", "ibpo_gspo",
        **{"ibpo.operator": "vouched_steps", "train.budget": GSPO_BUDGET}), tasks=("countdown",))
# In the order a seed trains them: the baseline first, the arms that are on one task only last.
ORACLE_RUNS = (GSPO, IBPO, ORACLE_SEQ, ORACLE_TOKEN, PEER_STEPS, VOUCHED_BUDGET, VOUCHED)
# Each arm against GSPO, and the oracle against the paper's operator: (a, b, question).
PAIRS = (("IBPO-GSPO", "GSPO", "the paper's operator"),
         ("oracle, sequence", "GSPO", "oracle credit, sequence level"),
         ("oracle, token", "GSPO", "oracle credit, token level"),
         ("oracle, sequence", "IBPO-GSPO", "oracle against the paper's operator"),
         ("peer_steps", "GSPO", "peer_steps"),
         ("vouched_steps", "GSPO", "vouched_steps, GSPO's steps"),
         ("vouched_steps, GSPO's budget", "GSPO", "vouched_steps, GSPO's budget"))

ORACLE_ITEMS = (
    Item(
        "oracle", "Issue #57: what would perfect credit buy? Oracle first errors, paired seeds",
        ORACLE_RUNS, {r.label: NO_CLAIM for r in ORACLE_RUNS},
        "none (the paper has no oracle); asked here: whether φ's credit is what fails (a) or "
        "whether shaping a terminal reward by partial credit does not help GSPO at all (b)",
        min_seeds=ORACLE_SEEDS, paired=True,
        keeps=("first_error_agreement", "adv_mass_before_error", "canonical_fallback_frac"),
        probe=Lazy("experiments.reports.paired:probe"),
        smoke=("oracle, token",)),  # the checker's labels and token credit through a step
)
