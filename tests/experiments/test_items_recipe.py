"""The issues' items, `recipe` (#45) and `scale` (#46): what they plan (runs, overrides,
budgets, seeds, tasks), and how an item without a paper's claim is reported."""

import json
import statistics

import pytest

from experiments import items, items_paper, items_recipe, reproduce
from experiments import items_registry as registry
from experiments.items import NO_CLAIM, Item, Run, did, run
from experiments.reports import item_notes, report, summary

ARITH_LONGEST = {"arith": 38, "arith_long": 88}  # the longest right answer, EOS included


def _config(r: Run, task: str):
    from ibpo_jax import train

    preset, extra = reproduce.TASKS[task]
    cmd = reproduce.command(r, task=task, preset=preset, seed=0, workdir="/tmp/unused",
                            extra=extra)
    return train.parse(cmd[3:])[1]  # the trainer's own parse and checks


def test_a_run_may_ask_for_more_seeds_or_fewer_than_its_item():
    assert Run("a", "gspo", min_seeds=5).seeds(3) == 5
    assert Run("a", "gspo", min_seeds=5).seeds(7) == 7
    assert Run("a", "gspo", max_seeds=2).seeds(3) == 2
    assert Run("a", "gspo").seeds(3) == 3


def test_a_difference_of_differences_reads_four_runs():
    c = did("A", "B", "C", "D", name="A-B vs C-D", expect=NO_CLAIM)
    assert c.terms == ((1.0, "A", "final"), (-1.0, "B", "final"), (-1.0, "C", "final"),
                       (1.0, "D", "final"))
    assert c.labels == ("A", "B", "C", "D") and c.expect == NO_CLAIM


def test_needs_names_several_keys_and_smoke_names_its_runs():
    toy = Item("toy", "Toy", (items_paper.GSPO,), {}, "claim",
               needs="rollout.dynamic_sampling, model.lora.nope")
    assert toy.missing() == "config key model.lora.nope does not exist yet"
    assert Item("toy", "Toy", (items_paper.GSPO,), {}, "c", needs="model.lora.rank").missing() == ""
    assert Item("toy", "Toy", (items_paper.GSPO, items_paper.IBPO), {}, "c").smoke_runs == (
        items_paper.GSPO,)
    with pytest.raises(ValueError, match="smoke names PPO, not among its runs"):
        Item("toy", "Toy", (items_paper.GSPO,), {}, "claim", smoke=("PPO",))


@pytest.mark.parametrize("task", ["arith", "arith_long"])
def test_recipe_runs_spend_the_default_runs_budget(task):
    item = registry.ITEMS["recipe"]
    default = _config(items_paper.GSPO, task)
    # 200 steps x 32 prompts x G 8 = 51,200, the default run's trajectories
    assert default.train.steps * default.rollout.prompts_per_step * \
        default.rollout.group_size == 51_200 == items_recipe.RECIPE_BUDGET
    cfgs = {r.label: _config(r, task) for r in item.runs}
    assert list(cfgs) == ["GSPO", "IBPO-GSPO", "GSPO + DS", "IBPO-GSPO + DS", "recipe",
                          "recipe + IBPO"]
    # Without dynamic sampling the default runs themselves (reused): exactly B x G a step, so
    # their 200 steps spend the budget; the others stop at it.
    assert item.runs[:2] == (items_paper.GSPO, items_paper.IBPO)
    for label, cfg in cfgs.items():
        spent = cfg.train.budget or cfg.train.steps * 256
        assert spent == 51_200, label
        # a step samples >= B x G, so the budget binds by the last step
        assert cfg.train.steps * 256 >= spent, label
        assert cfg.rollout.dynamic_sampling == ("DS" in label or "recipe" in label), label
        assert cfg.loss.name == "gspo"
        assert (cfg.ibpo.operator != "terminal") == ("IBPO" in label), label  # φ = 0: GSPO
    for label in ("recipe", "recipe + IBPO"):
        cfg = cfgs[label]
        assert (cfg.loss.clip_eps_high, cfg.loss.aggregation, cfg.reward.overlong) == (
            0.28, "token_mean", "soft")
        # the soft penalty starts after the longest right answer: 48 - 10 > 38, 96 - 8 > 88
        assert cfg.reward.overlong_buffer == {"arith": 10, "arith_long": 8}[task]
        assert cfg.rollout.max_new_tokens - cfg.reward.overlong_buffer >= ARITH_LONGEST[task]
    for label in ("GSPO", "IBPO-GSPO"):  # without dynamic sampling: the preset's recipe
        assert (cfgs[label].loss.clip_eps_high, cfgs[label].reward.overlong) == (
            default.loss.clip_eps_high, "none")


def test_the_longest_right_answers_are_what_the_buffers_assume():
    from ibpo_jax.data import arith

    for task, steps in (("arith", 3), ("arith_long", 8)):
        cfg = _config(items_paper.GSPO, task)
        assert cfg.task.arith.num_steps == steps
        recs = arith.generate(arith.ArithConfig(num_steps=steps, digits=cfg.task.arith.digits),
                              0, 2000)
        assert max(len(r["reference"]) + 1 for r in recs) == ARITH_LONGEST[task]


def _planned(monkeypatch, tmp_path, name: str, **kw) -> dict[str, list[int]]:
    jobs = []
    monkeypatch.setattr(reproduce, "ensure_runs", lambda j, **k: jobs.extend(j))
    reproduce.reproduce([name], task=kw.pop("task", "arith"), parallel=1, out=tmp_path, **kw)
    out: dict[str, list[int]] = {}
    for r, s in jobs:
        out.setdefault(r.label, []).append(s)
    return out


def test_recipe_trains_five_seeds_of_its_pair_and_three_of_the_rest(monkeypatch, tmp_path):
    planned = _planned(monkeypatch, tmp_path, "recipe", seeds=None, smoke=False)
    assert planned == {"GSPO": [0, 1, 2], "IBPO-GSPO": [0, 1, 2], "GSPO + DS": [0, 1, 2],
                       "IBPO-GSPO + DS": [0, 1, 2], "recipe": [0, 1, 2, 3, 4],
                       "recipe + IBPO": [0, 1, 2, 3, 4]}
    md = (tmp_path / "arith" / "recipe.md").read_text()
    assert "Seeds per run: 0 (the item asks for at least 3; 5 for recipe; 5 for recipe + " \
           "IBPO). FEWER than asked" in md
    planned = _planned(monkeypatch, tmp_path, "recipe", seeds=6, smoke=False)
    assert all(s == list(range(6)) for s in planned.values())
    # --smoke: one seed of the run that has every knob of the recipe
    assert _planned(monkeypatch, tmp_path, "recipe", seeds=None, smoke=True) == {
        "recipe + IBPO": [0]}


def test_scale_reuses_the_full_runs_and_gives_lora_its_own_rate(monkeypatch, tmp_path):
    item = registry.ITEMS["scale"]
    runs = {r.label: r for r in item.runs}
    # the full, on-policy runs are C.2's: the same directories, not retrained
    assert runs["GSPO"].name == "gspo" and runs["IBPO-GSPO"].name == "ibpo_gspo"
    assert {r.name for r in registry.ITEMS["curves"].runs} == {"gspo", "ibpo_gspo"}
    full = _config(runs["GSPO"], "arith")
    for label in ("GSPO LoRA", "IBPO-GSPO LoRA"):
        cfg = _config(runs[label], "arith")
        assert (cfg.model.lora.rank, cfg.model.lora.alpha) == (16, 16.0)
        assert cfg.optim.lr == pytest.approx(10 * full.optim.lr) == pytest.approx(3e-4)
        assert cfg.rollout.off_policy_steps == 0
    for label in ("GSPO off-policy 1", "IBPO-GSPO off-policy 1"):
        cfg = _config(runs[label], "arith")
        assert (cfg.rollout.off_policy_steps, cfg.model.lora.rank, cfg.optim.lr) == (
            1, 0, full.optim.lr)
    assert _planned(monkeypatch, tmp_path, "scale", seeds=None, smoke=False) == {
        label: [0, 1, 2] for label in runs}
    assert [c.name for c in item.comparisons] == [
        "GSPO LoRA vs GSPO", "IBPO-GSPO LoRA vs IBPO-GSPO", "GSPO off-policy 1 vs GSPO",
        "IBPO-GSPO off-policy 1 vs IBPO-GSPO"]


def test_each_item_runs_on_its_tasks_only(tmp_path, capsys):
    planned = {t: [n for n, i in registry.ITEMS.items() if i.planned(t)]
               for t in ("arith", "arith_long", "countdown")}
    assert "recipe" in planned["arith"] and "recipe" in planned["arith_long"]
    assert "scale" in planned["arith"] and "scale" not in planned["arith_long"]
    assert planned["countdown"] == ["table2a", "curves", "variants", "credit", "prefix_credit",
                                    "oracle"]
    with pytest.raises(SystemExit):
        reproduce.main(["scale", "--task", "arith_long", "--report-only", "--out", str(tmp_path)])
    assert "scale: not planned on --task arith_long" in capsys.readouterr().err
    summary.write_summary(tmp_path, tasks=("arith", "arith_long", "countdown"))
    row = next(line for line in (tmp_path / "README.md").read_text().splitlines()
               if line.startswith("| Issue #46"))
    assert row.endswith("| not run yet | not planned | not planned | not yet: `arith` to run |")


def _three(x: float, n: int = 3) -> list[float]:
    """n values with mean x and sd 0.01 (n = 3: x - 0.01, x, x + 0.01)."""
    return [x - 0.01, x, x + 0.01] if n == 3 else [x - 0.01, x - 0.005, x, x + 0.005, x + 0.01]


def test_an_item_without_a_claim_says_what_the_runs_show():
    item = registry.ITEMS["recipe"]
    finals = {"GSPO": 0.50, "IBPO-GSPO": 0.52, "GSPO + DS": 0.55, "IBPO-GSPO + DS": 0.60}
    s = {label: {"final": _three(x)} for label, x in finals.items()}
    s |= {label: {"final": _three(0.60, 5)} for label in ("recipe", "recipe + IBPO")}
    short, why = report.verdict(item, s)
    # +5 pts, se 0.0082 (t 6.1, 4 df: p 0.0036, Holm x3 0.011): higher; the difference of
    # differences (0.60 - 0.55) - (0.52 - 0.50) = +3 pts, se 0.0115 (t 2.6, 8 df: p 0.0317,
    # Holm x2 0.063): level; the pair: 0.
    assert short == ("recipe + IBPO vs recipe: level; IBPO-GSPO + DS vs GSPO + DS: higher; "
                     "IBPO's gain with DS vs without: level")
    assert "IBPO's gain with DS vs without: +3.0 pts [" in why
    assert "paper's way" not in why and "against the paper" not in why
    judged = report.judge(item, s)
    assert [round(j.adjusted_p, 3) for j in judged] == [1.0, 0.011, 0.063]
    assert report.counts(judged) == {"n": 3, "for": 0, "against": 0, "level": 2, "open": 0,
                                     "found": 1}
    table = "\n".join(report.comparison_table(judged))
    assert "| IBPO-GSPO + DS vs GSPO + DS | no claim | +5.0 pts [" in table
    assert table.splitlines()[3].endswith("| higher |")


def _recipe_records(recs, item: Item, seeds: int = 3) -> None:
    """Records of every run: DS runs log 16 of 2 x 32 groups filtered and evaluate at step 25
    after 25 x 512 trajectories; the others 50 % all-same groups and 25 x 256."""
    recs.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(item.runs):
        ds = "DS" in r.label or "recipe" in r.label
        per_step = 512 if ds else 256
        for s in range(r.seeds(seeds)):
            rows = [{"step": 0, "eval_accuracy": 0.5, "budget_trajectories": 0.0},
                    {"step": 10, "frac_groups_all_same": 0.0 if ds else 0.5,
                     **({"groups_filtered": 16.0, "sampling_rounds": 2.0} if ds else {})},
                    {"step": 25, "eval_accuracy": 0.52 + 0.01 * i,
                     "budget_trajectories": 25.0 * per_step + s}]
            (recs / f"{r.name}_s{s}.json").write_text(json.dumps(
                {"base": None, "config": {"seed": s, "rollout": {"prompts_per_step": 32}},
                 "rows": rows}))


def test_recipe_reports_mixed_groups_and_trajectories_to_gspos_final(tmp_path):
    item = registry.ITEMS["recipe"]
    _recipe_records(tmp_path / "runs", item)
    report.write_item(item, runs=item.runs, seeds=3, records_dir=tmp_path / "runs",
                      out_dir=tmp_path, command="test", missing="", task="arith")
    md = (tmp_path / "recipe.md").read_text()
    # GSPO's final is 52 %: every run reaches it at step 25, the DS runs after 12,800 more
    # trajectories (mean of 12,800 + seed over seeds 0-2 or 0-4: 12,801 and 12,802)
    assert "| steps to GSPO's final | trajectories to it |" in md
    assert "| GSPO | 3 | 50.0 ± 0.0 | 52.0 ± 0.0 | 2.0 ± 0.0 | 25 | 6,401 |" in md
    assert "| recipe + IBPO | 5 | 50.0 ± 0.0 | 57.0 ± 0.0 | 7.0 ± 0.0 | 25 | 12,802 |" in md
    assert "Seeds per run: 3-5 (the item asks for at least 3; 5 for recipe; 5 for " \
           "recipe + IBPO)." in md
    ctx = items.ProbeContext(item=item, task="arith", preset="arith_tiny", extra=(), seeds=3,
                             asked=3, smoke=False, measure=False, records_dir=tmp_path / "runs",
                             runs_dir=tmp_path, out_dir=tmp_path, command="test")
    lines = item_notes.mixed_groups(ctx)
    # without DS 1 - 0.5 of both; with it 1 - 16 / (2 x 32) = 75 % sampled, 100 % trained
    assert "| GSPO | 3 | 50.0 ± 0.0 | 50.0 ± 0.0 |" in lines
    assert "| recipe + IBPO | 5 | 75.0 ± 0.0 | 100.0 ± 0.0 |" in lines


def test_a_pair_short_of_its_own_seeds_says_so(tmp_path):
    item = registry.ITEMS["recipe"]
    _recipe_records(tmp_path / "runs", item, seeds=3)
    for s in (3, 4):  # the pair with 3 of its 5 seeds
        for label in ("recipe", "recipe + IBPO"):
            r = next(x for x in item.runs if x.label == label)
            (tmp_path / "runs" / f"{r.name}_s{s}.json").unlink()
    report.write_item(item, runs=item.runs, seeds=3, records_dir=tmp_path / "runs",
                      out_dir=tmp_path, command="test", missing="")
    verdict = json.loads((tmp_path / "recipe.json").read_text())["verdict"]
    assert verdict.endswith("(so far: 3 of 5 seeds in recipe, 3 of 5 seeds in recipe + IBPO)")
    assert "FEWER than asked" in (tmp_path / "recipe.md").read_text()


def test_scale_says_what_each_variant_saves_per_step_on_one_host():
    s = {"GSPO": {"step_s": [4.0, 4.2, 4.4, 9.0], "step_cpu": ["A", "A", "A", "B"]},
         "GSPO LoRA": {"step_s": [3.0, 3.1, 3.2], "step_cpu": ["A", "A", "A"]}}
    note = item_notes.step_time(s)
    # host A only: 3.10 vs 4.20 s, -1.10 s, ratio 3.1 / 4.2 = 0.738
    assert note.startswith("Wall time per step (median pace): GSPO LoRA 3.10 s vs 4.20 s "
                           "(3 vs 3 seeds on A: -1.10 s [")
    assert note.endswith(", x0.74)")
    assert item_notes.step_time({"GSPO": s["GSPO"]}) == ""
    rows = [{"step": 0, "time_total_s": 20.0}, {"step": 10, "time_total_s": 60.0},
            {"step": 20, "time_total_s": 90.0}, {"step": 30, "time_total_s": 200.0}]
    assert report.step_seconds(rows) == statistics.median([4.0, 3.0, 11.0]) == 4.0


def test_declarations_build_one_registry_without_cycles():
    assert list(registry.ITEMS)[-3:] == ["recipe", "scale", "oracle"]
    assert registry.ORDER == tuple(registry.ITEMS)
    assert {r.name for r in items_recipe.SCALE_RUNS} >= {"gspo", "ibpo_gspo"}
    assert run("x", "gspo", **{"train.budget": 1}).name == "gspo__budget=1"
