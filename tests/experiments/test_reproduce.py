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

from experiments import gradient_probe, items, report, reproduce

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


@pytest.mark.parametrize("name", items.ORDER)
def test_every_item_writes_a_parsable_result(smoke_out, name):
    out, _ = smoke_out
    md = (out / "arith" / f"{name}.md").read_text()
    verdict = json.loads((out / "arith" / f"{name}.json").read_text())
    assert verdict["verdict"]
    assert f"python -m experiments.reproduce {name} --task arith --smoke" in md
    if items.ITEMS[name].missing():
        assert verdict["verdict"] == "not run" and "**Not run**" in md
        return
    if name == "credit":  # a probe, no runs: one row per signal, rates in percent
        rows = [line for line in md.splitlines() if line.startswith("| lcs: ")
                or line.startswith("| prefix: ")]
        assert len(rows) == 10 and all(re.search(r"\| \d+\.\d ± \d+\.\d \|", r) for r in rows)
        assert (out / "arith" / "credit.png").stat().st_size > 1000
        assert (out / "runs" / "arith" / "credit_s0.json").exists()
        return
    if name == "variants":  # + the probe: variants on the same batches of the base policy
        section = md.split("## Same batches, at the base policy")[1]
        row = next(line for line in section.splitlines() if line.startswith("| IBPO-GSPO |"))
        cells = [c.strip() for c in row.split("|")[2:-1]]
        share = float(cells[gradient_probe.KEYS.index("grad_share_before_error")])
        assert 0 <= share <= 1 and float(cells[0]) > 0, row
        assert (out / "runs" / "arith" / "gradient_probe_s0.json").exists()
    # The first run's row: its final accuracy is a number in percent, and the plot exists.
    row = next(line for line in md.splitlines()
               if line.startswith(f"| {items.ITEMS[name].runs[0].label} |"))
    final = row.split("|")[4].strip()
    assert re.fullmatch(r"\d+\.\d", final), row
    assert (out / "arith" / f"{name}.png").stat().st_size > 1000


def test_cancellation_verdict_judges_each_fix_and_reports_the_mechanisms(tmp_path):
    item = items.ITEMS["cancellation"]
    fixed = {a for a, _ in items.CANCELLATION_FIXES}
    assert {b for _, b in items.CANCELLATION_FIXES} | fixed == {r.label for r in item.runs}
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
    assert result["verdict"] == "partly"
    text = (tmp_path / "cancellation.md").read_text()
    assert "token_mean / min_replace vs token_mean / none: higher" in text
    assert "token_mean / adv_orthogonal vs token_mean / none: level" in text
    assert "M1, the residual before the update: seq_mean_token_mean / none 0.3050" in text
    assert "is higher than token_mean / none" in text


def test_summary_says_whether_each_claim_holds_across_the_tasks():
    both = ("arith", "arith_long")
    assert report.overall(dict(zip(both, ("holds", "holds")))) == "**yes** (both tasks)"
    assert report.overall(dict(zip(both, ("does not hold",) * 2))) == "**no** (neither task)"
    assert report.overall(dict(zip(both, ("does not hold", "holds")))) == "only on `arith_long`"
    assert report.overall(dict(zip(both, ("partly", "does not hold")))) == "partly"
    assert report.overall(dict(zip(both, ("holds", "incomplete (so far: 2 of 7 runs)")))) == (
        "not yet: `arith_long` to run")
    assert report.overall(dict(zip(both, ("not run yet",) * 2))) == (
        "not yet: `arith`, `arith_long` to run")
    assert report.overall(dict(zip(both, ("default 90.9 %", "default 91.3 %")))) == (
        "see the cells")
    assert report.overall({"arith": "holds"}) == "**yes**"


def test_summary_links_every_item_and_records_are_compact(smoke_out):
    out, stdout = smoke_out
    summary = (out / "README.md").read_text()
    for name in items.ORDER:
        assert f"(arith/{name}.md)" in summary
    records = list((out / "runs" / "arith").glob("*.json"))
    assert records and all(r.stat().st_size < 20_000 for r in records)
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


def test_compare_rule_by_hand():
    assert report.compare([0.5, 0.52, 0.51], [0.30, 0.31, 0.29]) == "higher"
    assert report.compare([0.30, 0.31, 0.29], [0.5, 0.52, 0.51]) == "lower"
    assert report.compare([0.5, 0.6], [0.52, 0.58]) == "level"
    assert report.compare([0.5], [0.4]).startswith("n/a")


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
    short, why = report.verdict(items.ITEMS["variants"], {k: {"final": v} for k, v in s.items()})
    assert short == "holds"
    assert "no std division vs GSPO no std division: higher (p " in why
    assert "token credit vs GSPO: lower (p " in why
    assert why.endswith("over the 7 cells; 5 not judged yet)")


def test_welch_p_matches_scipy_and_holm_matches_hand_values():
    from scipy import stats

    a, b = [0.50, 0.52, 0.51], [0.48, 0.47, 0.50, 0.49]
    assert report.welch_p(a, b) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert report.welch_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(0.0213, abs=1e-4)
    assert report.welch_p([0.5, 0.5], [0.4, 0.4]) == 0.0  # neither side varies
    assert math.isnan(report.welch_p([0.5], [0.4, 0.41]))
    # Sorted 0.01, 0.03, 0.04: x3 = 0.03, x2 = 0.06, x1 = 0.04 -> kept at the running max 0.06.
    assert report.holm([0.01, 0.04, 0.03], 3) == pytest.approx([0.03, 0.06, 0.06])
    # Two more hypotheses not tested yet count as the largest p-values.
    assert report.holm([0.01, 0.04, 0.03], 5) == pytest.approx([0.05, 0.12, 0.12])


def test_a_variant_that_wins_only_before_the_correction_does_not_settle_the_claim():
    # IBPO-GSPO higher by 2 SE at p = 0.02 (t = 4.8): a win alone, not one of 7 cells.
    s = {"GSPO": [0.318, 0.322, 0.317], "IBPO-GSPO": [0.327, 0.328, 0.325]}
    item = items.ITEMS["variants"]
    assert report.compare(s["IBPO-GSPO"], s["GSPO"]) == "higher"
    assert report.welch_p(s["IBPO-GSPO"], s["GSPO"]) < 0.05
    short, why = report.verdict(item, {k: {"final": v} for k, v in s.items()})
    assert short == "undetermined" and "Holm" in why
    level = {k: [0.32, 0.321, 0.322] for k in ("token credit", "token granularity",
                                                "λ=4.0", "no std division",
                                                "GSPO no std division", "λ=4.0, no std",
                                                "token credit, no std")}
    assert report.verdict(item, {k: {"final": v} for k, v in (s | level).items()})[0] \
        == "does not hold"


def test_variants_without_a_win_stay_undetermined_while_a_cell_has_one_seed():
    level = [0.50, 0.51, 0.50]
    s = {r.label: level for r in items.ITEMS["variants"].runs} | {"token credit": [0.49]}
    summaries = {k: {"final": v} for k, v in s.items()}
    assert report.verdict(items.ITEMS["variants"], summaries)[0] == "undetermined"
    summaries["token credit"] = {"final": [0.49, 0.50, 0.50]}
    assert report.verdict(items.ITEMS["variants"], summaries)[0] == "does not hold"


def test_an_every_pair_claim_waits_for_its_pairs_unless_already_partly():
    item = items.ITEMS["table2b"]  # λ=0.5 against GSPO, λ=0.1 and λ=2.0; GSPO against λ=2.0
    high, low = [0.60, 0.61, 0.60], [0.50, 0.51, 0.50]
    s = {"GSPO": low, "λ=0.5": high}
    judge = lambda s: report.verdict(item, {k: {"final": v} for k, v in s.items()})  # noqa
    short, why = judge(s)  # one pair won, two unrecorded: they could still fail
    assert short == "incomplete" and why.endswith("(3 of 4 pairs not judged yet)")
    assert judge(s | {"λ=0.1": [0.3]})[0] == "incomplete"  # one seed cannot judge a pair
    assert judge(s | {"λ=0.1": high})[0] == "partly"  # a win beside a level: settled
    assert judge({"GSPO": high, "λ=0.5": low})[0] == "incomplete"  # a loss alone is not
    assert judge(s | {"λ=0.1": low, "λ=2.0": low})[0] == "partly"  # λ=2 level with GSPO
    assert judge(s | {"λ=0.1": low, "λ=2.0": [0.40, 0.41, 0.40]})[0] == "holds"


def test_speed_asks_ibpo_to_reach_gspos_final_in_38_percent_of_the_steps(tmp_path):
    item = items.ITEMS["speed"]
    (tmp_path / "runs").mkdir()

    def write(ibpo_curve):
        for r, curve in zip(item.runs, ([0.5, 0.52, 0.54, 0.56, 0.60], ibpo_curve)):
            for s in range(3):
                rows = [{"step": 50 * i, "eval_accuracy": a} for i, a in enumerate(curve)]
                (tmp_path / "runs" / f"{r.name}_s{s}.json").write_text(
                    json.dumps({"base": None, "config": {}, "rows": rows}))
        report.write_item(item, runs=item.runs, seeds=3, records_dir=tmp_path / "runs",
                          out_dir=tmp_path, command="test", missing="")
        return json.loads((tmp_path / "speed.json").read_text())

    fast = write([0.5, 0.61, 0.62, 0.62, 0.62])
    assert fast["verdict"] == "holds" and "at step 50 of 200 (25%" in fast["why"]
    (tmp_path / "runs" / f"{item.runs[1].name}_s2.json").unlink()  # 2 of the 3 seeds asked
    report.write_item(item, runs=item.runs, seeds=3, records_dir=tmp_path / "runs",
                      out_dir=tmp_path, command="test", missing="")
    early = json.loads((tmp_path / "speed.json").read_text())["verdict"]
    assert early == "holds (so far: 2 of 3 seeds in some runs)"
    assert report.overall({"arith": early}) == "not yet: `arith` to run"
    slow = write([0.5, 0.55, 0.58, 0.60, 0.61])
    assert slow["verdict"] == "does not hold" and "at step 150 of 200 (75%" in slow["why"]
    never = write([0.5, 0.52, 0.53, 0.55, 0.58])
    assert never["verdict"] == "does not hold" and "never reaches GSPO's final, 60.0 %" in (
        never["why"])


def test_sizes_asks_for_a_larger_gain_at_the_larger_size():
    item = items.ITEMS["sizes"]
    assert [r.label for r in item.runs] == ["GSPO 0.5x", "IBPO 0.5x", "GSPO", "IBPO-GSPO"]
    judge = lambda s: report.verdict(item, {k: {"final": v} for k, v in s.items()})  # noqa
    low, mid, high = [0.40, 0.41, 0.40], [0.50, 0.51, 0.50], [0.60, 0.61, 0.60]
    short, why = judge({"GSPO 0.5x": low, "IBPO 0.5x": low, "GSPO": mid, "IBPO-GSPO": high})
    assert short == "holds"
    assert why == ("IBPO - GSPO: +0.0 pts at 0.5x (level), +10.0 at the default size "
                   "(higher)")
    # The gain shrinks with size: only partly.
    assert judge({"GSPO 0.5x": low, "IBPO 0.5x": high, "GSPO": mid,
                  "IBPO-GSPO": high})[0] == "partly"
    assert judge({"GSPO": mid, "IBPO-GSPO": high})[0] == "incomplete"


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

    from experiments import credit_probe

    peers = np.array([True, True, True, False])
    assert credit_probe._majority(np.array([3, 1, 3, 0]), peers) == 3
    assert credit_probe._majority(np.array([3, 1, 2, 0]), peers) == 1


@pytest.mark.parametrize("preset", sorted(p for p, _ in reproduce.TASKS.values()))
def test_sweep_cells_that_reuse_the_default_run_are_the_default(preset):
    """table2b's λ=0.5 and C.3's G=8 train no second copy of IBPO/GSPO: that is only right
    while they are the presets' defaults."""
    from configs import base

    cfg = base.make("ibpo_gspo", preset)
    assert cfg.ibpo.lam == items.DEFAULT_LAM
    assert cfg.rollout.group_size == items.DEFAULT_G
    assert cfg.rollout.prompts_per_step * cfg.rollout.group_size == items.TRAJECTORIES_PER_STEP
    cells = {r.label: r for r in items.ITEMS["table2b"].runs + items.ITEMS["group_size"].runs}
    assert cells["λ=0.5"].name == "ibpo_gspo"
    assert cells["GSPO G=8"].name == "gspo" and cells["IBPO G=8"].name == "ibpo_gspo"
    assert cells["λ=0.3"].overrides == (("ibpo.lam", "0.3"),)
    # C.4's GRPO is the cancellation grid's default cell: only while that cell is GRPO's
    # default loss, and logging the drift is all the run adds.
    grpo = base.make("grpo", preset)
    assert (grpo.loss.aggregation, grpo.cancellation.transform) == (
        items.DEFAULT_AGGREGATION, items.DEFAULT_TRANSFORM)
    cancel = {r.label: r for r in items.ITEMS["cancellation"].runs}
    optim = {r.label: r for r in items.ITEMS["optimizers"].runs}
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
    item = items.ITEMS["curves"]
    report.write_item(item, runs=item.runs, seeds=3, records_dir=recs, out_dir=tmp_path,
                      command="test", missing="")
    assert json.loads((tmp_path / "curves.json").read_text())["verdict"] == "mixed bases"


def test_two_bases_are_mixed_only_when_one_config_has_two_sets_of_weights():
    def recs(source, sha):
        return [{"base": {"source": source, "sha256": sha}}] * 2

    # C.1: each size starts from its own base, by design.
    assert report.mixed_bases({"GSPO 0.5x": recs("arith_half", "1"),
                               "GSPO": recs("arith_default", "2")}) == ""
    # The same warm-start config made on two hosts: two sets of weights.
    assert "arith_default has 2" in report.mixed_bases({"GSPO": recs("arith_default", "2"),
                                                        "IBPO": recs("arith_default", "3")})
    # A run's seeds on two bases.
    assert "seeds of GSPO" in report.mixed_bases(
        {"GSPO": recs("arith_default", "2") + recs("arith_half", "1")})


def test_steps_to_the_baseline_count_against_gspo_on_the_same_base(tmp_path):
    def record(source, accs):
        return {"base": {"source": source, "sha256": source}, "config": {},
                "rows": [{"step": 50 * i, "eval_accuracy": a} for i, a in enumerate(accs)]}

    item = items.ITEMS["sizes"]
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
    assert rows["IBPO 0.5x"][6] == "50" and rows["GSPO 0.5x"][6] == "100"
    assert rows["IBPO-GSPO"][6] == "100" and rows["GSPO"][6] == "100"


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
    assert items.ITEMS["curves"].min_seeds == 2
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
    seeds = {}
    monkeypatch.setattr(gradient_probe, "ensure", lambda **k: seeds.update(k) or [])
    recs = tmp_path / "runs" / "arith"
    recs.mkdir(parents=True)
    rows = [{"step": 0, "eval_accuracy": 0.5}, {"step": 200, "eval_accuracy": 0.55}]
    item = items.ITEMS["variants"]
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
    assert seeds["seeds"] == 3 and seeds["probe"]  # the probe runs beside the item's grid


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
    from ibpo_jax.trainer import loop, policy

    monkeypatch.setenv("IBPO_DATA_DIR", str(tmp_path))  # not the user's cache
    preset, extra = reproduce.TASKS[task]
    missing = set()
    for run in {r for item in items.ITEMS.values() for r in item.runs}:
        cmd = reproduce.command(run, task=task, preset=preset, seed=0, workdir=tmp_path,
                                extra=extra)
        _, cfg = train.parse(cmd[3:])
        path = policy.warm_start_dir(cfg, loop.build_tokenizer(cfg).vocab_size)
        if not (path.parent == policy.COMMITTED and (path / "model.safetensors").exists()):
            missing.add(f"{run.label}: {path.name}")
    assert not missing, sorted(missing)
