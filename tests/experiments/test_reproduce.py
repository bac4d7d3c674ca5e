"""`python -m experiments.reproduce ITEM --smoke` for every item: the files each writes parse,
hold numbers, and the summary links them; finished runs are not trained again."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import items, items_paper, reproduce
from experiments import items_registry as registry
from experiments.probes import credit_probe, gradient_probe
from experiments.reports import plots, provenance, report, stats, summary
from experiments.reports import report_provenance as prov
from ibpo_jax.trainer import logs

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory, smoke_data_dir):
    out = tmp_path_factory.mktemp("reproduce")
    env = {**os.environ, "IBPO_DATA_DIR": str(smoke_data_dir), "XLA_FLAGS": ""}
    proc = subprocess.run([sys.executable, "-m", "experiments.reproduce", "all", "--smoke",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout


@pytest.mark.parametrize("name", registry.ORDER)
def test_every_item_writes_a_parsable_result(smoke_out, name):
    out, _ = smoke_out
    md = (out / "arith" / f"{name}.md").read_text()
    verdict = json.loads((out / "arith" / f"{name}.json").read_text())
    assert verdict["verdict"]
    assert f"python -m experiments.reproduce {name} --task arith --smoke" in md
    if registry.ITEMS[name].missing():
        assert verdict["verdict"] == "not run" and "**Not run**" in md
        return
    if name == "credit":  # a probe, no runs: one row per signal, rates in percent
        rows = [line for line in md.splitlines() if line.startswith("| lcs: ")
                or line.startswith("| prefix: ")]
        assert len(rows) == 10 and all(re.search(r"\| \d+\.\d ± \d+\.\d \|", r) for r in rows)
        for name in (credit_probe.PEER_STEPS, credit_probe.COMPLETION,  # issue 57's signals
                     credit_probe.COMPLETION_LAST, *credit_probe.VOUCHED.values()):
            assert re.search(rf"^\| {re.escape(name)} \| \d+\.\d ± \d+\.\d \|", md, re.M)
        assert (out / "arith" / "credit.png").stat().st_size > 1000
        assert (out / "runs" / "arith" / "credit_s0.json").exists()
        return
    if name == "prefix_credit":  # a probe of the base (and final policies): no runs of its own
        assert re.search(r"^\| base policy \| 1 \|", md, re.M), md
        assert (out / "arith" / "prefix_credit.png").stat().st_size > 1000
        assert (out / "runs" / "arith" / "prefix_credit_s0.json").exists()
        return
    if registry.ITEMS[name].paired:  # its own page: the smoke arm's row and the figure
        row = next(line for line in md.splitlines()
                   if line.startswith(f"| {registry.ITEMS[name].smoke_runs[0].label} |"))
        assert re.fullmatch(r"\d+\.\d", row.split("|")[3].strip()), row
        assert (out / "runs" / "arith" / "paired").is_dir()
        assert (out / "arith" / f"{name}.png").stat().st_size > 1000
        return
    if name == "variants":  # + the probe: variants on the same batches of the base policy
        section = md.split("## Same batches, at the base policy")[1]
        row = next(line for line in section.splitlines() if line.startswith("| IBPO-GSPO |"))
        cells = [c.strip() for c in row.split("|")[2:-1]]
        share = float(cells[gradient_probe.KEYS.index("grad_share_before_error")])
        assert 0 <= share <= 1 and float(cells[0]) > 0, row
        assert (out / "runs" / "arith" / "gradient_probe_s0.json").exists()
    # The smoke run's row: its final accuracy is a number in percent, and the plot exists.
    row = next(line for line in md.splitlines()
               if line.startswith(f"| {registry.ITEMS[name].smoke_runs[0].label} |"))
    final = row.split("|")[4].strip()
    assert re.fullmatch(r"\d+\.\d", final), row
    assert (out / "arith" / f"{name}.png").stat().st_size > 1000


def test_cancellation_verdict_judges_each_fix_and_reports_the_mechanisms(tmp_path):
    item = registry.ITEMS["cancellation"]
    fixed = {a for a, _ in items_paper.CANCELLATION_FIXES}
    assert {b for _, b in items_paper.CANCELLATION_FIXES} | fixed == {r.label for r in item.runs}
    (tmp_path / "runs").mkdir()
    for r in item.runs:
        # Only min_replace wins (by 5 points); M1: seq_mean_token_mean's residual is larger.
        acc = 0.6 if r.label.endswith("min_replace") else 0.55
        res = 0.3 if r.label.startswith("seq_mean_token_mean") else 0.0
        for s in range(2):
            rows = [{"step": 0, "eval_accuracy": 0.5},
                    {"step": 10, "cancellation_residual": res + 0.01 * s,
                     "cancellation_residual_updates": res + 0.01 * s, "entropy": 0.1},
                    {"step": 200, "eval_accuracy": acc + 0.002 * s}]
            (tmp_path / "runs" / f"{r.name}_s{s}.json").write_text(
                json.dumps({"base": None, "config": {}, "rows": rows}))
    report.write_item(item, runs=item.runs, seeds=2, records_dir=tmp_path / "runs",
                      out_dir=tmp_path, command="test", missing="")
    result = json.loads((tmp_path / "cancellation.json").read_text())
    # 3 of the 10 fixes are min_replace: t = 35 on 2 df (p 8e-4), x10 by Holm: still < 0.05.
    assert result["verdict"] == "partly (3/10 for, 0 against)"
    assert result["counts"] == {"n": 10, "for": 3, "against": 0, "level": 7, "open": 0}
    assert "token_mean / min_replace vs token_mean / none: +5.0 pts [" in result["why"]
    text = (tmp_path / "cancellation.md").read_text()
    row = next(line for line in text.splitlines()
               if line.startswith("| token_mean / adv_orthogonal vs token_mean / none |"))
    assert "| +0.0 pts [" in row and "| 1 | 1 | level (smallest effect these seeds detect" in row
    assert "3 of 10 go the paper's way, 0 against, rest level" in text
    assert "M1, the residual before the update: seq_mean_token_mean / none 0.3050" in text
    assert "is higher than token_mean / none" in text


def test_summary_says_whether_each_claim_holds_across_the_tasks():
    both = ("arith", "arith_long")
    overall = summary.overall
    assert overall(dict(zip(both, ("holds (2/2 for, 0 against)",) * 2))) == "**yes** (both tasks)"
    assert overall(dict(zip(both, ("does not hold",) * 2))) == "**no** (neither task)"
    assert overall(dict(zip(both, ("does not hold", "holds")))) == "only on `arith_long`"
    assert overall(dict(zip(both, ("partly (1/4 for, 1 against)", "does not hold")))) == "partly"
    assert overall(dict(zip(both, ("not shown (0/3 for, 0 against)",) * 2))) == (
        "not shown on either task")
    assert overall(dict(zip(both, ("not shown", "does not hold")))) == "no or not shown"
    assert overall(dict(zip(both, ("holds", "incomplete (so far: 2 of 7 runs)")))) == (
        "not yet: `arith_long` to run")
    assert overall(dict(zip(both, ("not run yet",) * 2))) == (
        "not yet: `arith`, `arith_long` to run")
    assert overall(dict(zip(both, ("default 90.9 %", "default 91.3 %")))) == "see the cells"
    assert overall({"arith": "holds"}) == "**yes**"


def test_summary_links_every_item_and_records_are_compact(smoke_out):
    out, stdout = smoke_out
    summary = (out / "README.md").read_text()
    for name in registry.ORDER:
        assert f"(arith/{name}.md)" in summary
    # Training records stay compact; a probe's (its histograms per node class) under 40 KB.
    probes = {f"{n}_s0.json" for n in registry.ORDER if not registry.ITEMS[n].runs}
    records = [r for r in (out / "runs" / "arith").glob("*.json") if r.name not in probes]
    assert records and all(r.stat().st_size < 20_000 for r in records)
    assert all((out / "runs" / "arith" / p).stat().st_size < 40_000
               for p in probes if (out / "runs" / "arith" / p).exists())
    rec = json.loads(records[0].read_text())
    assert rec["command"].startswith("-m ibpo_jax.train") and rec["rows"][-1]["eval_accuracy"] >= 0
    # Each record names the base it started from (the smoke warm start) and the host's CPU.
    for r in records:
        base = json.loads(r.read_text())["base"]
        assert re.fullmatch(r"arith_[0-9a-f]{12}", base["source"]), base
        assert re.fullmatch(r"[0-9a-f]{16}", base["sha256"]), base
    # The CPU names its family / model and vector unit ("AMD EPYC" alone named hosts ~5x apart).
    if Path("/proc/cpuinfo").exists():
        assert re.fullmatch(r".+ \[family \d+ model \d+(, avx\w*)?\]", rec["cpu"]), rec["cpu"]
    assert rec["cpu"] == reproduce.cpu_model()
    # Shared runs are trained once: GSPO serves several items.
    assert stdout.count(" gspo_s0:") == 1


def test_a_recorded_run_is_not_trained_again(smoke_out, tmp_path):
    out, _ = smoke_out
    # With the records present, the item's report is rebuilt without any training.
    written = reproduce.reproduce(["table2a"], task="arith", seeds=None, parallel=1, smoke=True,
                                  out=out)
    assert out / "arith" / "table2a.md" in written


def test_welch_by_hand_two_samples():
    # a = 1, 2, 3; b = 4, 5, 6: d = -3, s² = 1 each, se = √(2/3) = 0.8165, t = -3.674, ν = 4.
    t = stats.welch([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert t.diff == pytest.approx(-3.0) and t.df == pytest.approx(4.0)
    assert t.p == pytest.approx(0.0213, abs=1e-4)
    # 95 %: ± t(0.975, 4) · se = ± 2.7764 · 0.8165 = ± 2.267
    assert (t.low, t.high) == pytest.approx((-5.267, -0.733), abs=1e-3)
    # MDE = (t(0.975, 4) + t(0.8, 4)) · 1 · √(2/3) = (2.7764 + 0.9410) · 0.8165 = 3.035
    assert t.mde == pytest.approx(3.035, abs=1e-3)


def test_welch_with_unequal_seed_counts_by_hand():
    # a: mean 0.51, s² 1e-4 (3 seeds); b: mean 0.485, s² 1.6667e-4 (4 seeds):
    # se² = 1e-4/3 + 1.6667e-4/4 = 7.5e-5, t = 0.025 / 0.0086603 = 2.8868,
    # ν = (7.5e-5)² / ((3.3333e-5)²/2 + (4.1667e-5)²/3) = 4.959
    from scipy import stats as sp

    a, b = [0.50, 0.52, 0.51], [0.48, 0.47, 0.50, 0.49]
    t = stats.welch(a, b)
    assert t.diff == pytest.approx(0.025) and t.df == pytest.approx(4.959, abs=1e-3)
    assert t.p == pytest.approx(2 * sp.t.sf(2.8868, 4.959), rel=1e-4)
    assert t.p == pytest.approx(sp.ttest_ind(a, b, equal_var=False).pvalue)


def test_t_quantiles_match_the_table():
    # Student's t table: t(0.975; 2, 4, 10, ∞) = 4.303, 2.776, 2.228, 1.960; t(0.8; 4) = 0.941
    from scipy import stats as sp

    for df, q in ((2, 4.303), (4, 2.776), (10, 2.228), (1e9, 1.960)):
        assert sp.t.ppf(0.975, df) == pytest.approx(q, abs=1e-3)
    assert sp.t.ppf(0.8, 4) == pytest.approx(0.941, abs=1e-3)


def test_one_sample_and_difference_of_differences_contrasts():
    # One sample against 1: mean 0.9, s = 0.1, n = 3: t = -1.732, ν = 2, p = 0.2254
    t = stats.contrast(terms=[(1.0, [0.8, 0.9, 1.0])], ref=1.0)
    assert t.diff == pytest.approx(-0.1) and t.df == pytest.approx(2.0)
    assert t.p == pytest.approx(0.2254, abs=1e-4)
    # (a - b) - (c - d), every s² = 5e-5 over 2 seeds: se = √(4 · 5e-5 / 2) = 0.01,
    # ν = (1e-4)² / (4 · (2.5e-5)² / 1) = 4
    xs = [[0.60, 0.61], [0.50, 0.51], [0.55, 0.56], [0.50, 0.51]]
    t = stats.contrast(terms=list(zip((1.0, -1.0, -1.0, 1.0), xs)))
    assert t.diff == pytest.approx(0.05) and t.df == pytest.approx(4.0)
    assert t.high - t.diff == pytest.approx(2.7764 * 0.01, abs=1e-5)
    # No spread anywhere: the difference is exact.
    assert stats.welch([0.5, 0.5], [0.4, 0.4]).p == 0.0
    assert stats.welch([0.5, 0.5], [0.5, 0.5]).p == 1.0
    assert math.isnan(stats.welch([0.5], [0.4, 0.41]).p)


def test_minutes_per_run_leave_a_pause_out():
    # 20 s of start-up, then 2 s per step; the process stopped for 1,000 s between steps 20 and
    # 30, and a 1-step row at the start: median pace 2 s/step over 40 steps.
    rows = [{"step": 0, "time_total_s": 20.0}, {"step": 1, "time_total_s": 22.0},
            {"step": 10, "time_total_s": 40.0}, {"step": 20, "time_total_s": 60.0},
            {"step": 30, "time_total_s": 1080.0}, {"step": 40, "time_total_s": 1100.0}]
    assert report.run_minutes(rows) == pytest.approx((20 + 40 * 2) / 60)
    assert report.run_minutes(rows[:1]) == pytest.approx(20 / 60)


def test_variants_are_judged_against_gspo_with_the_same_normalization():
    s = {"GSPO": [0.50, 0.51, 0.50], "GSPO no std division": [0.30, 0.31, 0.30],
         "no std division": [0.40, 0.41, 0.40], "token credit": [0.45, 0.46, 0.45]}
    short, why = report.verdict(registry.ITEMS["variants"],
                                {k: {"final": v} for k, v in s.items()})
    assert short == "holds (1/7 for, 1 against)"  # "some variant": one win is enough
    assert "no std division vs GSPO no std division: +10.0 pts [" in why
    assert "token credit vs GSPO: -5.0 pts [" in why and "lower (against the paper)" in why
    assert why.startswith("1 of 7 go the paper's way, 1 against, 0 level, 5 not judged yet")


def test_holm_matches_hand_values():
    # Sorted 0.01, 0.03, 0.04: x3 = 0.03, x2 = 0.06, x1 = 0.04 -> kept at the running max 0.06.
    assert stats.holm([0.01, 0.04, 0.03], 3) == pytest.approx([0.03, 0.06, 0.06])
    # Two more hypotheses not tested yet count as the largest p-values.
    assert stats.holm([0.01, 0.04, 0.03], 5) == pytest.approx([0.05, 0.12, 0.12])
    assert stats.holm([0.5, 0.9], 2) == pytest.approx([1.0, 1.0])


def test_a_variant_that_wins_only_before_the_correction_does_not_settle_the_claim():
    # IBPO-GSPO higher at Welch p = 0.02 (t = 4.8): a win alone, not one of 7 cells' family.
    s = {"GSPO": [0.318, 0.322, 0.317], "IBPO-GSPO": [0.327, 0.328, 0.325]}
    item = registry.ITEMS["variants"]
    assert stats.welch(s["IBPO-GSPO"], s["GSPO"]).p < 0.05
    short, why = report.verdict(item, {k: {"final": v} for k, v in s.items()})
    assert short == "incomplete (0/7 for, 0 against)" and "Holm p 0.14" in why
    level = {k: [0.32, 0.321, 0.322] for k in ("token credit", "token granularity",
                                                "λ=4.0", "no std division",
                                                "GSPO no std division", "λ=4.0, no std",
                                                "token credit, no std")}
    assert report.verdict(item, {k: {"final": v} for k, v in (s | level).items()})[0] \
        == "not shown (0/7 for, 0 against)"


def test_variants_without_a_win_stay_incomplete_while_a_cell_has_one_seed():
    level = [0.50, 0.51, 0.50]
    s = {r.label: level for r in registry.ITEMS["variants"].runs} | {"token credit": [0.49]}
    summaries = {k: {"final": v} for k, v in s.items()}
    assert report.verdict(registry.ITEMS["variants"], summaries)[0].startswith("incomplete")
    summaries["token credit"] = {"final": [0.49, 0.50, 0.50]}
    assert report.verdict(registry.ITEMS["variants"], summaries)[0] == (
        "not shown (0/7 for, 0 against)")
    summaries["λ=4.0"] = {"final": [0.01, 0.02]}  # a collapse: against, no win
    assert report.verdict(registry.ITEMS["variants"], summaries)[0] == (
        "does not hold (0/7 for, 1 against)")


def test_verdict_words_are_a_function_of_the_counts():
    word = report.verdict_word
    c = lambda k, m, n, o=0: {"for": k, "against": m, "n": n, "open": o,  # noqa: E731
                              "level": n - k - m - o}
    assert word(c(4, 0, 4)) == "holds" and word(c(1, 0, 4)) == "partly"
    assert word(c(1, 3, 4)) == "partly" and word(c(0, 1, 4)) == "does not hold"
    assert word(c(0, 0, 4)) == "not shown"
    assert word(c(1, 0, 4, 2)) == "incomplete"  # the open two could make it hold
    assert word(c(1, 1, 4, 2)) == "partly"  # nothing the open two give changes it
    assert word(c(0, 0, 7), some=True) == "not shown"
    assert word(c(0, 2, 7), some=True) == "does not hold"
    assert word(c(1, 2, 7, 3), some=True) == "holds"
    assert word(c(0, 2, 7, 3), some=True) == "incomplete"
    assert report.tally(c(1, 1, 4)) == "1 of 4 go the paper's way, 1 against, rest level"


def test_table2b_compares_lambda_half_with_every_other_lambda_and_gspo():
    item = registry.ITEMS["table2b"]
    names = [c.name for c in item.comparisons]
    assert names == ["λ=0.5 vs GSPO", "λ=0.5 vs λ=0.1", "λ=0.5 vs λ=0.3", "λ=0.5 vs λ=0.7",
                     "λ=0.5 vs λ=1.0", "λ=0.5 vs λ=2.0", "GSPO vs λ=2.0"]
    assert "IBPO-GSPO vs GSPO" in [c.name for c in registry.ITEMS["table2a"].comparisons]
    high, low = [0.60, 0.61, 0.60], [0.50, 0.51, 0.50]
    judge = lambda s: report.verdict(item, {k: {"final": v} for k, v in s.items()})  # noqa
    short, why = judge({"GSPO": low, "λ=0.5": high})  # one won, six unrecorded
    assert short == "incomplete (1/7 for, 0 against)" and "6 not judged yet" in why
    assert judge({"GSPO": high, "λ=0.5": low})[0] == "incomplete (0/7 for, 1 against)"
    cells = {f"λ={lam}": low for lam in items_paper.LAMBDAS} | {"λ=0.5": high, "GSPO": low}
    assert judge(cells)[0] == "partly (6/7 for, 0 against)"  # λ=2 level with GSPO
    assert judge(cells | {"λ=2.0": [0.40, 0.41, 0.40]})[0] == "holds (7/7 for, 0 against)"


def test_speed_asks_ibpo_to_reach_gspos_final_in_38_percent_of_the_steps(tmp_path):
    item = registry.ITEMS["speed"]
    (tmp_path / "runs").mkdir()

    def write(ibpo_curve):
        for r, curve in zip(item.runs, ([0.5, 0.52, 0.54, 0.56, 0.60], ibpo_curve)):
            for s in range(3):
                rows = [{"step": 50 * i, "eval_accuracy": a + 0.001 * s}
                        for i, a in enumerate(curve)]
                (tmp_path / "runs" / f"{r.name}_s{s}.json").write_text(
                    json.dumps({"base": None, "config": {}, "rows": rows}))
        report.write_item(item, runs=item.runs, seeds=3, records_dir=tmp_path / "runs",
                          out_dir=tmp_path, command="test", missing="")
        return json.loads((tmp_path / "speed.json").read_text())

    # "early": step 50 of 200, the last evaluation within 150 / 400 of the steps.
    fast = write([0.5, 0.62, 0.62, 0.62, 0.62])
    assert fast["verdict"] == "holds (1/1 for, 0 against)"
    assert "at step 50 of 200" in fast["why"] and "reaches GSPO's final" in fast["why"]
    (tmp_path / "runs" / f"{item.runs[1].name}_s2.json").unlink()  # 2 of the 3 seeds asked
    report.write_item(item, runs=item.runs, seeds=3, records_dir=tmp_path / "runs",
                      out_dir=tmp_path, command="test", missing="")
    early = json.loads((tmp_path / "speed.json").read_text())["verdict"]
    assert early == "holds (1/1 for, 0 against) (so far: 2 of 3 seeds in some runs)"
    assert summary.overall({"arith": early}) == "not yet: `arith` to run"
    slow = write([0.5, 0.55, 0.58, 0.60, 0.61])
    assert slow["verdict"] == "does not hold (0/1 for, 1 against)"
    never = write([0.5, 0.52, 0.53, 0.55, 0.58])
    assert "never reaches GSPO's final (60.1 %)" in never["why"]


def test_sizes_asks_for_a_larger_gain_at_the_larger_size():
    item = registry.ITEMS["sizes"]
    assert [r.label for r in item.runs] == ["GSPO 0.5x", "IBPO 0.5x", "GSPO", "IBPO-GSPO"]
    judge = lambda s: report.verdict(item, {k: {"final": v} for k, v in s.items()})  # noqa
    low, mid, high = [0.40, 0.41, 0.40], [0.50, 0.51, 0.50], [0.60, 0.61, 0.60]
    short, why = judge({"GSPO 0.5x": low, "IBPO 0.5x": low, "GSPO": mid, "IBPO-GSPO": high})
    assert short == "partly (2/3 for, 0 against)"  # no gain at the half size
    assert "gain at the default size vs gain at 0.5x: +10.0 pts [" in why
    # The gain shrinks with size: against.
    assert judge({"GSPO 0.5x": low, "IBPO 0.5x": high, "GSPO": mid,
                  "IBPO-GSPO": high})[0] == "partly (2/3 for, 1 against)"
    assert judge({"GSPO 0.5x": low, "IBPO 0.5x": mid, "GSPO": low,
                  "IBPO-GSPO": high})[0] == "holds (3/3 for, 0 against)"
    assert judge({"GSPO": mid, "IBPO-GSPO": high})[0].startswith("incomplete")


def test_a_run_stopped_at_its_budget_is_finished(tmp_path):
    """A budget-matched run ends before train.steps, with an evaluation at the step that
    reached train.budget: that is its final row; without it the run is still going."""
    (tmp_path / "config.json").write_text(json.dumps({"train": {"steps": 200, "budget": 1000}}))
    rows = [{"step": 0, "eval_accuracy": 0.5, "budget_trajectories": 0.0},
            {"step": 3, "accuracy": 0.5, "budget_trajectories": 768.0},
            {"step": 4, "accuracy": 0.5, "budget_trajectories": 1024.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert reproduce.compact(tmp_path, ["python", "-m", "x"]) is None
    rows[-1]["eval_accuracy"] = 0.6
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rec = reproduce.compact(tmp_path, ["python", "-m", "x"])
    assert rec["rows"][-1] == {"step": 4, "eval_accuracy": 0.6, "budget_trajectories": 1024.0,
                               "accuracy": 0.5}
    # A torn last line (a run still writing) is dropped quietly; a bad line before it is
    # damage, named FILE:LINE, not skipped.
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    (tmp_path / "metrics.jsonl").write_text(text + '{"step": 5, "acc')
    assert reproduce.compact(tmp_path, ["python", "-m", "x"])["rows"] == rec["rows"]
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval\n' + text)
    with pytest.raises(logs.MetricsFileError, match=r"metrics.jsonl:1: unreadable"):
        reproduce.compact(tmp_path, ["python", "-m", "x"])


def test_only_names_runs_of_the_items():
    with pytest.raises(SystemExit, match="--only SCoRe: no such run in table1; runs: GRPO, GSPO"):
        reproduce.reproduce(["table1"], task="arith", seeds=1, parallel=1, smoke=True,
                            out=Path("/nonexistent"), only=("SCoRe",))


def test_items_join_by_commas_and_an_unknown_one_is_named(capsys):
    with pytest.raises(SystemExit):
        reproduce.main(["curves,tabel1", "--smoke"])
    assert "unknown item tabel1; valid: table1, " in capsys.readouterr().err


def test_a_run_another_driver_trains_is_left_alone(tmp_path):
    import fcntl

    log = tmp_path / "logs" / "x_s0.log"
    log.parent.mkdir()
    with open(log.with_suffix(".lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        marker = tmp_path / "trained"
        workdir, seconds, err = reproduce._train(
            ([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], tmp_path / "w", log))
        assert err == "being trained by another driver" and not marker.exists()
    workdir, seconds, err = reproduce._train(
        ([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], tmp_path / "w", log))
    assert err == "" and marker.exists()
    # finished by the other driver while this one waited: not started again
    done = tmp_path / "w"
    done.mkdir()
    (done / "config.json").write_text(json.dumps({"train": {"steps": 1, "budget": 0}}))
    (done / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval_accuracy": 0.5}) + "\n")
    marker.unlink()
    workdir, seconds, err = reproduce._train(
        ([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], done, log))
    assert err == "" and not marker.exists()


def test_credit_probe_majority_ties_go_to_the_earliest():
    import numpy as np

    from experiments.probes import credit_probe

    peers = np.array([True, True, True, False])
    assert credit_probe._majority(np.array([3, 1, 3, 0]), peers) == 3
    assert credit_probe._majority(np.array([3, 1, 2, 0]), peers) == 1


@pytest.mark.parametrize("preset", sorted(p for p, _ in reproduce.TASKS.values()))
def test_sweep_cells_that_reuse_the_default_run_are_the_default(preset):
    """table2b's λ=0.5 and C.3's G=8 train no second copy of IBPO/GSPO: that is only right
    while they are the presets' defaults."""
    from configs import base

    cfg = base.make("ibpo_gspo", preset)
    assert cfg.ibpo.lam == items_paper.DEFAULT_LAM
    assert cfg.rollout.group_size == items_paper.DEFAULT_G
    assert cfg.rollout.prompts_per_step * cfg.rollout.group_size == \
        items_paper.TRAJECTORIES_PER_STEP
    cells = {r.label: r for r in registry.ITEMS["table2b"].runs
             + registry.ITEMS["group_size"].runs}
    assert cells["λ=0.5"].name == "ibpo_gspo"
    assert cells["GSPO G=8"].name == "gspo" and cells["IBPO G=8"].name == "ibpo_gspo"
    assert cells["λ=0.3"].overrides == (("ibpo.lam", "0.3"),)
    # C.4's GRPO is the cancellation grid's default cell: only while that cell is GRPO's
    # default loss, and logging the drift is all the run adds.
    grpo = base.make("grpo", preset)
    assert (grpo.loss.aggregation, grpo.cancellation.transform) == (
        items_paper.DEFAULT_AGGREGATION, items_paper.DEFAULT_TRANSFORM)
    cancel = {r.label: r for r in registry.ITEMS["cancellation"].runs}
    optim = {r.label: r for r in registry.ITEMS["optimizers"].runs}
    assert cancel["seq_mean_token_mean / none"].name == optim["GRPO"].name
    assert optim["GRPO"].overrides == (("cancellation.log_drift", "True"),)
    assert cancel["token_mean / none"].name != optim["GRPO"].name


def test_records_from_different_bases_are_not_compared(tmp_path):
    def record(base, acc):
        return {"base": base, "config": {}, "rows": [{"step": 0, "eval_accuracy": 0.5},
                                                     {"step": 10, "eval_accuracy": acc}]}

    recs = tmp_path / "runs"
    recs.mkdir()
    for s, base in enumerate(({"sha256": "a"}, {"sha256": "b"}, {"sha256": "a"})):
        (recs / f"gspo_s{s}.json").write_text(json.dumps(record(base, 0.5)))
        (recs / f"ibpo_gspo_s{s}.json").write_text(json.dumps(record({"sha256": "a"}, 0.6)))
    item = registry.ITEMS["curves"]
    report.write_item(item, runs=item.runs, seeds=3, records_dir=recs, out_dir=tmp_path,
                      command="test", missing="")
    assert json.loads((tmp_path / "curves.json").read_text())["verdict"] == "mixed bases"


def test_two_bases_are_mixed_only_when_one_config_has_two_sets_of_weights():
    def recs(source, sha):
        return [{"base": {"source": source, "sha256": sha}}] * 2

    # C.1: each size starts from its own base, by design.
    assert prov.mixed_bases({"GSPO 0.5x": recs("arith_half", "1"),
                               "GSPO": recs("arith_default", "2")}) == ""
    # The same warm-start config made on two hosts: two sets of weights.
    assert "arith_default has 2" in prov.mixed_bases({"GSPO": recs("arith_default", "2"),
                                                        "IBPO": recs("arith_default", "3")})
    # A run's seeds on two bases.
    assert "seeds of GSPO" in prov.mixed_bases(
        {"GSPO": recs("arith_default", "2") + recs("arith_half", "1")})


def test_steps_to_the_baseline_count_against_gspo_on_the_same_base(tmp_path):
    def record(source, accs):
        return {"base": {"source": source, "sha256": source}, "config": {},
                "rows": [{"step": 50 * i, "eval_accuracy": a} for i, a in enumerate(accs)]}

    item = registry.ITEMS["sizes"]
    recs = {"GSPO 0.5x": record("half", [0.50, 0.52, 0.54]),
            "IBPO 0.5x": record("half", [0.50, 0.54, 0.55]),
            "GSPO": record("default", [0.20, 0.30, 0.40]),
            "IBPO-GSPO": record("default", [0.20, 0.35, 0.42])}
    (tmp_path / "runs").mkdir()
    for r in item.runs:
        for s in range(2):
            (tmp_path / "runs" / f"{r.name}_s{s}.json").write_text(json.dumps(recs[r.label]))
    report.write_item(item, runs=item.runs, seeds=2, records_dir=tmp_path / "runs",
                      out_dir=tmp_path, command="test", missing="")
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in
            (tmp_path / "sizes.md").read_text().splitlines() if line.startswith("| ")}
    assert "steps to GSPO's final on its base" in rows["run"]
    # 0.54 (GSPO 0.5x's final) is reached at step 50 by IBPO 0.5x, not against GSPO's 0.40.
    assert rows["IBPO 0.5x"][5] == "50" and rows["GSPO 0.5x"][5] == "100"
    assert rows["IBPO-GSPO"][5] == "100" and rows["GSPO"][5] == "100"


def test_report_only_trains_nothing_and_reports_the_records_there_are(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "ensure_runs", lambda *a, **k: pytest.fail("trained"))
    recs = tmp_path / "runs" / "arith"
    recs.mkdir(parents=True)
    rows = [{"step": 0, "eval_accuracy": 0.5}, {"step": 200, "eval_accuracy": 0.55}]
    (recs / "gspo_s0.json").write_text(json.dumps({"base": None, "config": {}, "rows": rows}))
    reproduce.main(["variants,credit,cancellation", "--report-only", "--out", str(tmp_path)])
    text = (tmp_path / "arith" / "variants.md").read_text()
    assert "| GSPO | 1 | 50.0 | 55.0 |" in text and "| token credit | 0 |" in text
    # A verdict from part of a grid says how much of it ran.
    verdict = json.loads((tmp_path / "arith" / "variants.json").read_text())["verdict"]
    assert verdict == "incomplete (so far: 1 of 9 runs)"
    assert "[incomplete (so far: 1 of 9 runs)](arith/variants.md)" in (
        tmp_path / "README.md").read_text()
    assert not (tmp_path / "arith" / "credit.md").exists()  # no record, no probe
    assert not (tmp_path / "arith" / "cancellation.md").exists()
    assert "not run yet" in (tmp_path / "README.md").read_text()


def test_report_only_reads_every_recorded_seed(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "ensure_runs", lambda *a, **k: pytest.fail("trained"))
    recs = tmp_path / "runs" / "arith"
    recs.mkdir(parents=True)
    for name, seeds in (("gspo", 3), ("ibpo_gspo", 2), ("gspo__normalize_std=False", 5)):
        for s in range(seeds):  # the last name is another run whose name starts like GSPO's
            rows = [{"step": 0, "eval_accuracy": 0.5}, {"step": 200, "eval_accuracy": 0.5 + s}]
            (recs / f"{name}_s{s}.json").write_text(
                json.dumps({"base": None, "config": {}, "rows": rows}))
    assert registry.ITEMS["curves"].min_seeds == 2
    reproduce.main(["curves", "--report-only", "--out", str(tmp_path)])
    text = (tmp_path / "arith" / "curves.md").read_text()
    assert "| GSPO | 3 |" in text and "| IBPO-GSPO | 2 |" in text
    assert "Hosts: unknown (5 runs)." in text  # records without a `cpu`
    # GSPO's third seed is another item's: this one's command trains 2 seeds of each run.
    assert "`python -m experiments.reproduce curves --task arith` from" in text
    assert "Seeds per run: 2-3 (the item asks for at least 2)." in text
    # With IBPO's third seed every run has 3: the command says so.
    (recs / "ibpo_gspo_s2.json").write_text(json.dumps({"base": None, "config": {}, "rows": rows}))
    reproduce.main(["curves", "--report-only", "--out", str(tmp_path)])
    assert "`python -m experiments.reproduce curves --task arith --seeds 3` from" in (
        tmp_path / "arith" / "curves.md").read_text()
    reproduce.main(["curves", "--report-only", "--seeds", "2", "--out", str(tmp_path)])
    assert "| GSPO | 2 |" in (tmp_path / "arith" / "curves.md").read_text()


def test_a_trained_report_reads_the_seeds_other_items_recorded(tmp_path, monkeypatch):
    # The report after training is the report-only one: the file's command reproduces it.
    monkeypatch.setattr(reproduce, "ensure_runs", lambda *a, **k: None)
    recs = tmp_path / "runs" / "arith"
    recs.mkdir(parents=True)
    for name, seeds in (("gspo", 3), ("ibpo_gspo", 2)):
        for s in range(seeds):
            rows = [{"step": 0, "eval_accuracy": 0.5}, {"step": 200, "eval_accuracy": 0.5 + s}]
            (recs / f"{name}_s{s}.json").write_text(
                json.dumps({"base": None, "config": {}, "rows": rows}))
    texts = []
    for argv in (["curves", "--seeds", "2"], ["curves", "--report-only"]):
        reproduce.main([*argv, "--out", str(tmp_path)])
        texts.append((tmp_path / "arith" / "curves.md").read_text())
    assert texts[0] == texts[1]
    assert "| GSPO | 3 |" in texts[0] and "reproduce curves --task arith` from" in texts[0]


def test_a_run_capped_below_the_items_seeds_trains_and_reports_its_own(tmp_path, monkeypatch):
    planned = []
    monkeypatch.setattr(reproduce, "ensure_runs",
                        lambda jobs, **k: planned.extend((r.label, s) for r, s in jobs))
    probes = []
    monkeypatch.setattr(gradient_probe, "ensure", lambda **k: probes.append(k) or [])
    recs = tmp_path / "runs" / "arith"
    recs.mkdir(parents=True)
    rows = [{"step": 0, "eval_accuracy": 0.5}, {"step": 200, "eval_accuracy": 0.55}]
    item = registry.ITEMS["variants"]
    for r in item.runs:
        for s in range(3):
            (recs / f"{r.name}_s{s}.json").write_text(
                json.dumps({"base": None, "config": {}, "rows": rows}))
    reproduce.main(["variants", "--out", str(tmp_path)])
    lam4 = [r.label for r in item.runs if r.max_seeds]
    assert lam4 == ["λ=4.0", "λ=4.0, no std"]
    assert sorted(s for label, s in planned if label == "λ=4.0") == [0, 1]
    assert sorted(s for label, s in planned if label == "GSPO") == [0, 1, 2]
    text = (tmp_path / "arith" / "variants.md").read_text()
    assert "| λ=4.0 | 2 |" in text and "| GSPO | 3 |" in text  # the third λ=4 record unread
    assert "Seeds per run: 3 (the item asks for at least 3)." in text
    assert "λ=4.0: 2 seed(s) of the 2 planned: at λ = 4 a wrong response" in text
    # The probe runs beside the item's grid (its seeds measured), then reads every record.
    assert [(k["seeds"], k["probe"]) for k in probes] == [(3, True), (3, False)]


def test_a_metric_that_some_seeds_lack_says_over_how_many_it_is():
    # (a diagnostic added after some of a cell's runs: their records do not have it)
    assert report._metric_cell([0.25, 0.75], 3, "grad_share_before_error") == \
        "0.5000 ± 0.3536 (2 seeds)"
    assert report._metric_cell([0.5, 0.5, 0.5], 3, "pg_var_ratio") == "0.5000 ± 0.0000"
    assert report._metric_cell([], 3, "pg_var_ratio") == "—"


@pytest.mark.parametrize("task", sorted(reproduce.TASKS))
def test_every_run_of_the_grid_starts_from_a_committed_base(task, tmp_path, monkeypatch):
    """A run whose base is not committed warm-starts one on its host, which another host
    cannot reproduce bit for bit (records from two bases are never compared)."""
    from ibpo_jax import train
    from ibpo_jax.trainer import policy, run_tasks

    monkeypatch.setenv("IBPO_DATA_DIR", str(tmp_path))  # not the user's cache
    preset, extra = reproduce.TASKS[task]
    missing = set()
    for run in {r for name, item in registry.ITEMS.items() for r in item.runs
                if registry.ITEMS[name].planned(task)}:
        cmd = reproduce.command(run, task=task, preset=preset, seed=0, workdir=tmp_path,
                                extra=extra)
        _, cfg = train.parse(cmd[3:])
        path = policy.warm_start_dir(cfg, run_tasks.build_tokenizer(cfg).vocab_size)
        if not (path.parent == policy.COMMITTED and (path / "model.safetensors").exists()):
            missing.add(f"{run.label}: {path.name}")
    assert not missing, sorted(missing)


def _synthetic_records(item: items.Item, recs, *, seeds: int = 3, extra: dict | None = None):
    """Records of every run of `item` (accuracies apart by run, the item's metrics logged)."""
    recs.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(item.runs):
        for s in range(seeds):
            rows = [{"step": 10 * t, "eval_accuracy": 0.5 + 0.01 * i + 0.002 * s + 0.001 * t,
                     "budget_trajectories": 100.0 * t,
                     **{k: 0.1 * i + 0.01 * s + 0.001 * t for k in item.metrics
                        if k != "budget_trajectories"}} for t in range(6)]
            (recs / f"{r.name}_s{s}.json").write_text(json.dumps(
                {"base": None, "config": {"seed": s}, "rows": rows, **(extra or {})}))


@pytest.mark.parametrize("name", [n for n in registry.ORDER if registry.ITEMS[n].runs])
def test_every_items_plot_renders_with_labels_and_a_caption(name, tmp_path, monkeypatch):
    import matplotlib.figure

    item = registry.ITEMS[name]
    _synthetic_records(item, tmp_path / "runs")
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda self, path, **k: figures.append(self) or Path(path).touch())
    report.write_item(item, runs=item.runs, seeds=3, records_dir=tmp_path / "runs",
                      out_dir=tmp_path, command="test", missing="")
    (fig,) = figures
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_ylabel()]
    curves = [ax for ax in panels if ax.get_legend() is not None
              and ax.get_xlabel() in ("RL step", "trajectories sampled (budget)")]
    assert curves and all(ax.get_ylabel() in plots.UNITS.values() or "(%)" in ax.get_ylabel()
                          for ax in curves)
    assert any(ax.get_ylabel() == "held-out accuracy (%)" for ax in panels)
    for ax in curves:  # at most PER_PANEL runs a panel, a style each
        handles = ax.get_legend().legend_handles
        assert len(handles) <= plots.PER_PANEL
        looks = {(h.get_color(), h.get_linestyle(), h.get_marker()) for h in handles}
        assert len(looks) == len(handles)
    md = (tmp_path / f"{name}.md").read_text()
    caption = md.strip().splitlines()[-1]
    assert caption.startswith("*") and ("±1 sd over each run's n seeds" in caption
                                        or "each line is one seed" in caption)
    if name == "table2b":  # Fig. 2: final accuracy against λ, the paper's beside it
        ax = next(a for a in panels if a.get_xlabel() == "λ (GSPO = 0)")
        assert any("paper" in a.get_ylabel() for a in fig.axes)
        assert len(ax.containers) == len(item.runs)  # an error bar per λ
    if name == "table1":
        assert "SCoRe+GRPO (2nd attempt) (n=3)" in [t.get_text() for ax in curves
                                                    for t in ax.get_legend().get_texts()]
    if name == "appendix_a":
        ratio = next(a for a in panels if a.get_ylabel() == plots.UNITS["pg_var_ratio"])
        levels = {round(line.get_ydata()[0], 2) for line in ratio.get_lines()
                  if len(set(line.get_ydata())) == 1}
        assert {1.0, 0.7} <= levels


def test_panels_hold_at_most_five_runs_each_beside_the_baseline():
    for n in range(1, 13):
        labels = [str(i) for i in range(n)]
        panels = plots.panels_of(labels)
        assert all(len(p) <= plots.PER_PANEL and p[0] == "0" for p in panels)
        assert {x for p in panels for x in p} == set(labels)
    # Each IBPO beside its base optimizer (C.4): whole pairs share a panel.
    item = registry.ITEMS["optimizers"]
    assert plots.panels_of([r.label for r in item.runs],
                           pairs=[c.labels for c in item.comparisons]) == [
        ["GRPO", "IBPO-GRPO", "GSPO", "IBPO-GSPO"], ["PPO", "IBPO-PPO"]]
    # The cancellation grid: a panel per aggregation, every run in one.
    item = registry.ITEMS["cancellation"]
    assert sorted(x for p in item.panels for x in p) == sorted(r.label for r in item.runs)
    looks = {tuple(plots.style(i).values()) for i in range(28)}
    assert len(looks) == 28 and all(plots.style(i)["color"] != "#000000" for i in range(1, 28))


def test_reports_name_code_truncation_shared_runs_and_unequal_seeds(tmp_path):
    item = registry.ITEMS["curves"]
    recs = tmp_path / "runs"
    _synthetic_records(item, recs, seeds=3, extra={"commit": "a" * 40, "dirty": False})
    gspo = item.runs[0]
    for s in range(3, 8):  # GSPO's seeds 3-7: 8 seeds against IBPO's 3
        rec = json.loads((recs / f"{gspo.name}_s0.json").read_text())
        rec |= {"commit": "b" * 40, "dirty": True, "truncated": "rows after step 40 dropped"
                if s == 7 else None}
        (recs / f"{gspo.name}_s{s}.json").write_text(json.dumps(rec))
    report.write_item(item, runs=item.runs, seeds=8, records_dir=recs, out_dir=tmp_path,
                      command="test", missing="")
    md = (tmp_path / "curves.md").read_text()
    assert "| GSPO | 8 |" in md and "| IBPO-GSPO | 3 |" in md
    assert "Seeds per run: 3-8" in md
    assert "Code (commit of each record): aaaaaaaaaa (6 records); bbbbbbbbbb dirty (5 records)." \
        in md
    assert "Truncated records: GSPO seed 0: rows after step 40 dropped." in md
    assert "GSPO (`gspo`) is also a run of table2a, table2b, speed, sizes" in md
    assert "the comparison IBPO-GSPO vs GSPO" not in md  # C.2 compares rewards, not accuracy
    assert "counted in table2a, table2b" in (
        prov.shared_runs(registry.ITEMS["optimizers"])[-1])


def test_backfill_adds_provenance_and_never_a_measured_value(tmp_path):
    # A committed record: its values were first committed by some commit; the code is at best
    # that commit's parent.
    path = next(iter(sorted((ROOT / "experiments/results/runs/arith").glob("gspo_s0.json"))))
    rec = {k: v for k, v in json.loads(path.read_text()).items()
           if k not in ("commit", "dirty", "commit_source")}
    first = provenance.origin(path, rec)
    out = provenance.backfill(rec, path=path)
    assert provenance.measured(out) == provenance.measured(rec)
    if first is None:  # a checkout without history
        assert out["commit"] == "unknown"
    else:
        parent = subprocess.run(["git", "rev-parse", f"{first}^"], cwd=ROOT, text=True,
                                capture_output=True).stdout.strip()
        assert out["commit"] == parent and out["dirty"] is None
        assert out["commit_source"].startswith(f"backfilled: parent of {first[:12]}")
    assert out["cpu"] == rec["cpu"]  # its own field stays
    # Not committed: unknown.
    fresh = tmp_path / "x_s0.json"
    fresh.write_text(json.dumps({"rows": [], "base": None}))
    assert provenance.backfill({"rows": [], "base": None}, path=ROOT / "nowhere_s0.json") == {
        "rows": [], "base": None, "commit": "unknown", "dirty": None,
        "commit_source": "unknown: the record is not committed", "cpu": "unknown"}
    # A message names a host only as where records ran.
    assert provenance.HOSTS.findall("3 seeds on AMD EPYC; first records")
    assert not provenance.HOSTS.findall("90.9 % (legacy Intel base: 97.9 %)")


def test_committed_records_name_their_code():
    for path in (ROOT / "experiments/results/runs").glob("*/*.json"):
        rec = json.loads(path.read_text())
        assert {"commit", "cpu"} <= rec.keys(), path
        assert rec.get("commit_source", "").startswith(("backfilled", "unknown")) or (
            "dirty" in rec and rec["commit"] != "unknown"), path


def test_front_page_verdict_table_matches_the_reports():
    """README's verdict table is the one `summary.front_page_table` makes from the committed
    reports (rewritten by every non-smoke `reproduce` run), so the front page cannot drift."""
    from experiments import reproduce
    from experiments.reports import summary

    text = (reproduce.ROOT / "README.md").read_text()
    block = text.split(summary.BEGIN, 1)[1].split(summary.END, 1)[0].strip()
    expected = summary.front_page_table(reproduce.RESULTS, tuple(reproduce.TASKS),
                                        link_prefix="experiments/results/")
    assert block == "\n".join(expected)
    assert text[:text.index(summary.END)].count("\n") < 60  # on the first screen
