"""The issues' own reproduction items (experiments/items.py says what an item is), about which
the papers make no claim: each comparison is `NO_CLAIM`, its verdict a plain statement.

- `recipe` (issue #45): does IBPO add anything to the RL recipe people run today (DAPO's:
  dynamic sampling, clip-higher, token-mean aggregation, soft overlong punishment), and does
  dynamic sampling change IBPO's effect? Every run at the default run's trajectory budget.
- `scale` (issue #46): what LoRA and one-step-off-policy rollouts cost GSPO and IBPO-GSPO in
  final accuracy and save in wall time per step, against full, on-policy fine-tuning.
"""

from __future__ import annotations

import dataclasses

from experiments.items import NO_CLAIM, Item, Lazy, Run, did, run, vs
from experiments.items_paper import GSPO, IBPO, TRAJECTORIES_PER_STEP

# Equal trajectory budget (DESIGN §6): the default run's 200 steps x 32 prompts x G 8, every
# sampled trajectory counted (dynamic sampling's discarded groups too). train.steps stays the
# presets' 200: a step samples at least B x G trajectories, so the budget binds by step 200
# (exactly there without dynamic sampling, earlier with it; the schedule is constant, so the
# horizon does not change the updates).
DEFAULT_STEPS = 200
RECIPE_BUDGET = DEFAULT_STEPS * TRAJECTORIES_PER_STEP  # 51,200
# Dynamic sampling spends about twice the trajectories a step (about half the groups are all
# right or all wrong), so its runs evaluate every 25 steps: about as many trajectories apart as
# the others' evaluations every 50, for the trajectories-to-accuracy column.
DS = {"rollout.dynamic_sampling": True, "train.eval_every": 25}
# DAPO's recipe (Yu et al. 2025): dynamic sampling, clip-higher ε_high = 0.28, token-mean
# aggregation, soft overlong punishment. Its buffer is DAPO's ~20 % of the response length
# where that leaves every right answer unpunished: 10 of `arith`'s 48 tokens (the longest
# reference, EOS included, is 38); on `arith_long` 20 % (19 of 96) would punish most right
# answers (median 76, longest 88 tokens), so 8 tokens there.
RECIPE = {**DS, "loss.clip_eps_high": 0.28, "loss.aggregation": "token_mean",
          "reward.overlong": "soft"}
OVERLONG_BUFFER = (("arith", "reward.overlong_buffer", "10"),
                   ("arith_long", "reward.overlong_buffer", "8"))
RECIPE_SEEDS = 5  # the pair the item's question rests on: recipe vs recipe + IBPO


def _budgeted(label: str, algo: str, overrides: dict, **fields) -> Run:
    r = run(label, algo, **{"train.budget": RECIPE_BUDGET}, **overrides)
    return dataclasses.replace(r, **fields)


# GSPO and IBPO-GSPO without dynamic sampling are the default runs (C.2's, reused, not
# retrained): a step samples exactly B x G, so their 200 steps spend exactly RECIPE_BUDGET.
RECIPE_RUNS = (
    GSPO, IBPO,
    _budgeted("GSPO + DS", "gspo", DS), _budgeted("IBPO-GSPO + DS", "ibpo_gspo", DS),
    *(_budgeted(label, algo, RECIPE, by_task=OVERLONG_BUFFER, min_seeds=RECIPE_SEEDS)
      for label, algo in (("recipe", "gspo"), ("recipe + IBPO", "ibpo_gspo"))))

# `scale`: LoRA of rank 16 on every projection (a common rank in the peers' LoRA examples).
# On the tiny model (hidden 128) that is 1/8 of the width, ~20 % of the projections'
# parameters: RL's updates are low-rank, so a cost found here is the frozen base's and the
# adapters' optimization, not a lack of rank. alpha = rank (scale 1). Adapters take their own
# learning rate, 10x the full fine-tune's 3e-5 (the usual LoRA rule; Schulman et al. 2025,
# "LoRA Without Regret", find ~10x optimal for RL too): an explicit override, so the pair
# compares each method at its own rate.
LORA = {"model.lora.rank": 16, "model.lora.alpha": 16.0, "optim.lr": 3e-4}
OFF_POLICY = {"rollout.off_policy_steps": 1}
SCALE_VARIANTS = (("LoRA", LORA), ("off-policy 1", OFF_POLICY))
# The full, on-policy runs are the default GSPO and IBPO-GSPO (C.2's, reused, not retrained).
SCALE_RUNS = (GSPO, IBPO, *(run(f"{base.label} {name}", base.algo, **overrides)
                            for name, overrides in SCALE_VARIANTS for base in (GSPO, IBPO)))

RECIPE_ITEMS = (
    Item(
        "recipe", "Issue #45: IBPO on top of the DAPO-style recipe, at equal budget",
        RECIPE_RUNS, {r.label: "no claim" for r in RECIPE_RUNS},
        "none (the papers predate the recipe); asked here: whether IBPO adds anything to "
        "dynamic sampling, clip-higher, token-mean and soft overlong punishment, and whether "
        "dynamic sampling changes IBPO's effect",
        min_seeds=3, needs="rollout.dynamic_sampling,reward.overlong",
        # The budget spent, the share of all-same groups in the trained batch (fillers with
        # dynamic sampling), the groups it filtered and its rounds, φ per scored response,
        # Appendix A's PG-variance ratio (IBPO's runs; 1 for GSPO's).
        metrics=("budget_trajectories", "frac_groups_all_same", "groups_filtered",
                 "sampling_rounds", "phi_mean", "pg_var_ratio"),
        keeps=("groups_mixed", "trajectories_sampled", "frac_truncated", "overlong_penalty_mean"),
        comparisons=(vs("recipe + IBPO", "recipe", expect=NO_CLAIM),
                     vs("IBPO-GSPO + DS", "GSPO + DS", expect=NO_CLAIM),
                     did("IBPO-GSPO + DS", "GSPO + DS", "IBPO-GSPO", "GSPO",
                         name="IBPO's gain with DS vs without", expect=NO_CLAIM)),
        sections=(Lazy("experiments.reports.item_notes:mixed_groups"),),
        panels=(("GSPO", "IBPO-GSPO", "GSPO + DS", "IBPO-GSPO + DS"),
                ("GSPO", "recipe", "recipe + IBPO")),
        tasks=("arith", "arith_long"), speed_in_trajectories=True,
        smoke=("recipe + IBPO",)),  # every knob of the recipe, and IBPO
    Item(
        "scale", "Issue #46: LoRA and one-step-off-policy rollouts against full fine-tuning",
        SCALE_RUNS, {r.label: "no claim" for r in SCALE_RUNS},
        "none (the papers train fully and on-policy); asked here: what LoRA (rank 16, lr "
        "3e-4) and one-step-off-policy rollouts cost in final accuracy and save in wall time "
        "per step", min_seeds=3,
        needs="model.lora.rank,rollout.off_policy_steps", metrics=("policy_lag",),
        keeps=("time_rollout_s", "time_update_s", "time_wait_s"),
        comparisons=tuple(vs(f"{base.label} {name}", base.label, expect=NO_CLAIM)
                          for name, _ in SCALE_VARIANTS for base in (GSPO, IBPO)),
        notes=(Lazy("experiments.reports.item_notes:step_time"),), tasks=("arith",),
        panels=tuple((b.label, *(f"{b.label} {name}" for name, _ in SCALE_VARIANTS))
                     for b in (GSPO, IBPO)),
        smoke=("IBPO-GSPO LoRA",)),  # off-policy's overrides: parsed by the planning tests
)
