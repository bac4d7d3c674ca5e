"""An item is one declaration (experiments/items_paper.py or items_recipe.py, of the types in
experiments/items.py): what its verdict reads is kept in its records, the driver and the
report know no item by name, and a new item (a training grid with a note and a section, or a
probe that trains nothing) takes one entry."""

import ast
import json
from pathlib import Path

import pytest

from experiments import items, items_paper, reproduce
from experiments import items_registry as registry
from experiments.items import Item, Lazy, vs

ROOT = Path(__file__).parents[2]


def _hooks(item: Item) -> list:
    return [*item.notes, *item.sections, *filter(None, [item.probe]),
            *filter(None, [item.finals_axis and item.finals_axis.position])]


@pytest.mark.parametrize("name", registry.ORDER)
def test_what_a_verdict_reads_is_kept_in_the_records(name):
    item, kept = registry.ITEMS[name], set(reproduce.kept())
    assert "eval_accuracy" in kept  # the SUMMARY_VALUES come from the evaluations
    for c in item.comparisons:
        for _, label, metric in c.terms:
            assert label in {r.label for r in item.runs}, (c.name, label)
            assert metric in items.SUMMARY_VALUES or (
                metric in item.metrics and metric in kept), (c.name, metric)
    assert set(item.metrics) | set(item.keeps) <= kept


def test_an_item_whose_verdict_reads_an_untabulated_metric_is_refused():
    with pytest.raises(ValueError, match="comparison IBPO-GSPO vs GSPO reads 'reward_var'"):
        Item("toy", "Toy", (items_paper.GSPO, items_paper.IBPO), {}, "claim",
             comparisons=(vs("IBPO-GSPO", "GSPO", metric="reward_var"),))
    with pytest.raises(ValueError, match="reads run 'PPO', not one of its runs"):
        Item("toy", "Toy", (items_paper.GSPO,), {}, "claim", comparisons=(vs("PPO", "GSPO"),))
    with pytest.raises(ValueError, match="item curves is declared twice"):
        items.declare(registry.ITEMS["curves"], registry.ITEMS["curves"])


def test_records_keep_what_every_item_tabulates_and_keeps(monkeypatch, tmp_path):
    toy = Item("toy", "Toy", (items_paper.GSPO,), {}, "claim", metrics=("toy_metric",),
               keeps=("toy_raw",))
    assert not {"toy_metric", "toy_raw"} & set(reproduce.kept())
    monkeypatch.setattr(registry, "ITEMS", items.declare(*registry.ITEMS.values(), toy))
    assert registry.ORDER[-1] == "toy" and {"toy_metric", "toy_raw"} <= set(reproduce.kept())
    (tmp_path / "config.json").write_text(json.dumps({"train": {"steps": 1, "budget": 0}}))
    (tmp_path / "metrics.jsonl").write_text(json.dumps(
        {"step": 1, "eval_accuracy": 0.5, "toy_metric": 1.0, "toy_raw": 2.0, "other": 3.0}))
    rec = reproduce.compact(tmp_path, ["python", "-m", "x"])
    assert rec["rows"] == [{"step": 1, "eval_accuracy": 0.5, "toy_metric": 1.0, "toy_raw": 2.0}]


@pytest.mark.parametrize("name", registry.ORDER)
def test_every_hook_an_item_names_resolves(name):
    for hook in _hooks(registry.ITEMS[name]):
        assert callable(hook.resolve() if isinstance(hook, Lazy) else hook), hook
    with pytest.raises(LookupError, match="hook experiments.items:nowhere"):
        Lazy("experiments.items:nowhere")()


@pytest.mark.parametrize("module", ["reproduce", "reports/report", "reports/report_provenance",
                                    "reports/summary", "reports/plots"])
def test_the_driver_and_the_report_know_no_item_by_name(module):
    src = (ROOT / "experiments" / f"{module}.py").read_text()
    assert "item.name ==" not in src and "item.name !=" not in src
    strings = {n.value for n in ast.walk(ast.parse(src))
               if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not strings & set(registry.ORDER), strings & set(registry.ORDER)


def _record(tmp_path: Path, run: items.Run, seed: int, final: float, toy: float) -> None:
    rows = [{"step": 0, "eval_accuracy": 0.5},
            {"step": 10, "toy_metric": toy + 0.01 * seed},
            {"step": 20, "eval_accuracy": final + 0.002 * seed}]
    path = tmp_path / "runs" / "arith" / f"{run.name}_s{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"base": None, "config": {"seed": seed}, "rows": rows}))


def test_a_toy_training_item_is_one_entry(tmp_path, monkeypatch):
    seen = []

    def section(ctx: items.ProbeContext) -> list[str]:
        seen.append(ctx)
        return ["", "## Toy section", "", f"{ctx.seeds} seeds, measured: {ctx.measure}"]

    toy = Item("toy", "Toy: IBPO against GSPO", (items_paper.GSPO, items_paper.IBPO),
               {"IBPO-GSPO": "higher"}, "IBPO-GSPO ends higher", metrics=("toy_metric",),
               comparisons=(vs("IBPO-GSPO", "GSPO"),
                            vs("IBPO-GSPO", "GSPO", metric="toy_metric", expect="lower")),
               notes=(lambda s: f"toy note on {len(s)} runs",), sections=(section,))
    monkeypatch.setattr(registry, "ITEMS", items.declare(*registry.ITEMS.values(), toy))
    for seed in range(3):
        _record(tmp_path, items_paper.GSPO, seed, 0.50, toy=0.3)
        _record(tmp_path, items_paper.IBPO, seed, 0.60, toy=0.1)
    reproduce.main(["toy", "--report-only", "--out", str(tmp_path)])
    md = (tmp_path / "arith" / "toy.md").read_text()
    verdict = json.loads((tmp_path / "arith" / "toy.json").read_text())
    assert verdict["verdict"] == "holds (2/2 for, 0 against)"
    assert "| IBPO-GSPO vs GSPO | higher | +10.0 pts [" in md
    assert "**Holds here?** holds (2/2 for, 0 against): 2 of 2 go the paper's way, 0 against, " \
           "rest level. toy note on 2 runs." in md
    # base, final, gain, steps to GSPO's final, the toy metric
    assert "| IBPO-GSPO | 3 | 50.0 ± 0.0 | 60.2 ± 0.2 | 10.2 ± 0.2 | 20 | 0.1100 ± 0.0100 |" in md
    assert md.endswith("## Toy section\n\n3 seeds, measured: False\n")
    (ctx,) = seen
    assert ctx.command == "python -m experiments.reproduce toy --task arith --seeds 3"
    assert (ctx.seeds, ctx.asked) == (3, 2)  # reads the 3 recorded, asked for the minimum
    assert ctx.records_dir == tmp_path / "runs" / "arith"
    assert "[holds (2/2 for, 0 against)](arith/toy.md)" in (tmp_path / "README.md").read_text()


def test_a_toy_probe_that_trains_nothing_is_one_entry(tmp_path, monkeypatch):
    """Like `credit` and `prefix_credit`: no runs of its own, its page written by its probe,
    which may read other runs' workdirs."""
    monkeypatch.setattr(reproduce, "ensure_runs", lambda jobs, **k: jobs and pytest.fail(jobs))
    seen = []

    def probe(ctx: items.ProbeContext) -> list[Path]:
        seen.append(ctx)
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        md, js = ctx.out_dir / f"{ctx.item.name}.md", ctx.out_dir / f"{ctx.item.name}.json"
        md.write_text(f"# {ctx.item.title}\n\nProduced by `{ctx.command}`.\n")
        js.write_text(json.dumps({"verdict": f"measured {ctx.seeds} seeds"}) + "\n")
        return [md, js]

    toy = Item("toy_probe", "Toy probe", (), {}, "a probe's claim", min_seeds=3, probe=probe)
    monkeypatch.setattr(registry, "ITEMS", items.declare(*registry.ITEMS.values(), toy))
    written = reproduce.reproduce(["toy_probe"], task="arith", seeds=None, parallel=1,
                                  smoke=True, out=tmp_path)
    assert tmp_path / "arith" / "toy_probe.md" in written
    ctx = seen[-1]
    assert (ctx.smoke, ctx.measure, ctx.seeds, ctx.preset) == (True, True, 1, "smoke")
    assert ctx.workdir(items_paper.GSPO, 0) == tmp_path / "workdirs" / "arith" / "gspo_s0"
    assert ctx.record(items_paper.IBPO, 2) == tmp_path / "runs" / "arith" / "ibpo_gspo_s2.json"
    assert "`python -m experiments.reproduce toy_probe --task arith --smoke`" in (
        tmp_path / "arith" / "toy_probe.md").read_text()
    assert "[measured 1 seeds](arith/toy_probe.md)" in (tmp_path / "README.md").read_text()
    reproduce.main(["toy_probe", "--report-only", "--task", "arith_long", "--out", str(tmp_path)])
    ctx = seen[-1]
    assert (ctx.smoke, ctx.measure, ctx.seeds, ctx.task) == (False, False, 3, "arith_long")
    assert ctx.runs_dir == ROOT / "runs" / "reproduce" / "arith_long"
    assert ctx.preset == reproduce.TASKS["arith_long"][0]
