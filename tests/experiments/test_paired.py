"""The paired design (issue 57): paired t against scipy, the page's pairs, its refusal to pair
records of different commits or hosts, and the driver's seed-major, clean-tree training."""

import json
import math
from pathlib import Path

import pytest
from scipy import stats as sp

from experiments import items_oracle, reproduce
from experiments.reports import paired, reuse, stats

ITEM = items_oracle.ORACLE_ITEMS[0]


def test_paired_t_matches_scipy_and_the_interval_by_hand():
    a, b = [0.50, 0.30, 0.20, 0.60, 0.10], [0.40, 0.35, 0.10, 0.50, 0.05]
    t = stats.paired([x - y for x, y in zip(a, b)])
    assert t.p == pytest.approx(sp.ttest_rel(a, b).pvalue)
    assert t.diff == pytest.approx(0.06)
    # sd of d = [.1, -.05, .1, .1, .05] is 0.06519, se 0.02915; t_0.975,4 = 2.776
    assert t.high - t.diff == pytest.approx(2.7764 * 0.0651920 / math.sqrt(5), rel=1e-4)
    # detectable: (t_0.975,4 + t_0.8,4) se = (2.7764 + 0.9410) * 0.029155
    assert t.mde == pytest.approx((2.7764 + 0.9410) * 0.0651920 / math.sqrt(5), rel=1e-3)
    assert math.isnan(stats.paired([0.1]).p)
    assert stats.paired([0.0, 0.0]).p == 1.0


def _records(tmp: Path, finals: dict[str, list[float]], *, commit="c0ffee", cpu="cpu A",
             odd: dict | None = None) -> Path:
    """Records of the oracle item's arms: final held-out accuracy per seed, the agreement
    logged at two steps; `odd` = {(label, seed): fields} overrides a record's provenance."""
    runs = {r.label: r for r in ITEM.runs}
    for label, values in finals.items():
        for seed, acc in enumerate(values):
            rec = {"commit": commit, "dirty": False, "cpu": cpu, "config": {"seed": seed},
                   "rows": [{"step": 0, "eval_accuracy": 0.2},
                            {"step": 10, "first_error_agreement": 0.4, "phi_mean": 0.1},
                            {"step": 20, "eval_accuracy": acc, "first_error_agreement": 0.6,
                             "phi_mean": 0.3}]}
            rec.update((odd or {}).get((label, seed), {}))
            (tmp / f"{runs[label].name}_s{seed}.json").write_text(json.dumps(rec))
    return tmp


GSPO = [0.30, 0.32, 0.28, 0.31]


def test_level_oracle_answers_b_and_a_winning_oracle_answers_a(tmp_path):
    noise = [0.001, -0.002, 0.002, -0.001]
    _records(tmp_path, {"GSPO": GSPO, "IBPO-GSPO": [g + e for g, e in zip(GSPO, noise)],
                        "oracle, sequence": [g - e for g, e in zip(GSPO, noise)],
                        "oracle, token": [g + 2 * e for g, e in zip(GSPO, noise)]})
    data = paired.records(ITEM, "arith", tmp_path, 8)
    assert set(data) == {"GSPO", "IBPO-GSPO", "oracle, sequence", "oracle, token"}
    rows = paired.compare(data, paired.provenance(data))
    assert [r["finding"] for r in rows] == ["level"] * 4  # no peer_steps on arith
    assert paired.answer(rows).startswith("(b)")
    # the oracle gains 5 points on every seed (± noise), IBPO nothing
    _records(tmp_path, {"oracle, sequence": [g + 0.05 + e for g, e in zip(GSPO, noise)]})
    data = paired.records(ITEM, "arith", tmp_path, 8)
    rows = paired.compare(data, paired.provenance(data))
    found = {(r["a"], r["b"]): r for r in rows}
    assert found[("oracle, sequence", "GSPO")]["finding"] == "higher"
    assert found[("oracle, sequence", "GSPO")]["test"].diff == pytest.approx(0.05)
    assert paired.answer(rows).startswith("(a)")


def _pairs(tmp: Path, label: str = "oracle, sequence") -> dict:
    data = paired.records(ITEM, "arith", tmp, 8)
    return paired.pairable(data, paired.provenance(
        data, reuse.reruns(tmp, {r.label: r.name for r in ITEM.runs})), label, "GSPO")


def test_a_seed_whose_arms_differ_in_commit_host_or_cleanliness_is_not_paired(tmp_path):
    finals = {"GSPO": GSPO, "oracle, sequence": [x + 0.05 for x in GSPO]}
    _records(tmp_path, finals, odd={("GSPO", 2): {"commit": "deadbeef"}})
    data = paired.records(ITEM, "arith", tmp_path, 8)
    prov = paired.provenance(data)
    assert len(prov.groups) == 2 and not prov.reused
    seeds, bad, why = _pairs(tmp_path)
    assert seeds == [0, 1, 3] and set(bad) == {2} and "2 commits" in bad[2] and not why
    out = tmp_path / "out"
    paired.write(ITEM, data, task="arith", out_dir=out, command="cmd", records_dir=tmp_path)
    md = (out / "oracle.md").read_text()
    assert "**Seed 2 left out of every pair:** its arms ran at 2 commits (c0ffee; deadbeef)" in md
    assert "| oracle, sequence − GSPO (oracle credit, sequence level) | 3 |" in md
    # a seed's arms on another host, together: paired (hosts may differ between seeds)
    _records(tmp_path, finals, odd={(label, 1): {"cpu": "cpu B"} for label in finals})
    assert _pairs(tmp_path)[:2] == ([0, 1, 2, 3], {})
    _records(tmp_path, finals, odd={("GSPO", 1): {"cpu": "cpu B"}})
    assert "2 hosts" in _pairs(tmp_path)[1][1]
    # a dirty record: its seed left out
    _records(tmp_path, finals, odd={("oracle, sequence", 1): {"dirty": True}})
    assert "dirty" in _pairs(tmp_path)[1][1]
    # whole seeds at another commit: nothing paired, said
    _records(tmp_path, finals, odd={(label, 3): {"commit": "beef"} for label in finals})
    assert "2 commits" in _pairs(tmp_path)[2]
    data = paired.records(ITEM, "arith", tmp_path, 8)
    paired.write(ITEM, data, task="arith", out_dir=out, command="cmd", records_dir=tmp_path)
    assert "refused (provenance)" in (out / "oracle.md").read_text()
    assert "not answered yet" in json.loads((out / "oracle.json").read_text())["why"]


def _rerun(tmp: Path, label: str, seed: int, commit: str, **changes) -> None:
    """A rerun of a record at `commit`: the same logged values, or `changes` to its last row."""
    run = {r.label: r for r in ITEM.runs}[label]
    rec = json.loads((tmp / f"{run.name}_s{seed}.json").read_text())
    rec.update(commit=commit)
    rec["rows"][-1].update(time_total_s=123.0, **changes)  # the clock never counts
    path = reuse.rerun_path(tmp, run.name, seed, commit)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(rec))


def test_an_arm_added_later_pairs_where_a_rerun_reproduces_its_partners_record(tmp_path):
    # GSPO at the old commit, the new arm at a newer one: not paired ...
    _records(tmp_path, {"GSPO": GSPO})
    _records(tmp_path, {"oracle, sequence": [x + 0.05 for x in GSPO]}, commit="newer")
    seeds, bad, _ = _pairs(tmp_path)
    assert seeds == [] and len(bad) == 4
    # ... until a rerun of one GSPO seed at the newer commit reproduces its record exactly
    _rerun(tmp_path, "GSPO", 0, "newer")
    seeds, bad, why = _pairs(tmp_path)
    assert (seeds, bad, why) == ([0, 1, 2, 3], {}, "")
    data = paired.records(ITEM, "arith", tmp_path, 8)
    said = paired.provenance(data, reuse.reruns(tmp_path, {"GSPO": "gspo"})).reused
    assert said == ["GSPO's seed 0 rerun at newer on cpu A reproduces its record at c0ffee "
                    "exactly (9 logged values): its 4 records of c0ffee on that host stand "
                    "for newer"]
    out = tmp_path / "out"
    paired.write(ITEM, data, task="arith", out_dir=out, command="cmd", records_dir=tmp_path)
    md = (out / "oracle.md").read_text()
    assert "Reused (`experiments/reports/reuse.py`): GSPO's seed 0 rerun" in md
    assert "| oracle, sequence − GSPO (oracle credit, sequence level) | 4 | +5.0 |" in md
    # one value off, or another host, or a dirty tree: nothing carried
    for changes, says in (({"eval_accuracy": 0.31}, "step 20, eval_accuracy: 0.31, not 0.3"),
                          ({"cpu": "cpu B"}, "not a clean rerun on its record's host"),
                          ({"dirty": True}, "not a clean rerun")):
        row = {k: v for k, v in changes.items() if k == "eval_accuracy"}
        _rerun(tmp_path, "GSPO", 0, "newer", **row)
        if not row:
            path = reuse.rerun_path(tmp_path, "gspo", 0, "newer")
            path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
        assert _pairs(tmp_path)[0] == []
        found = reuse.reruns(tmp_path, {"GSPO": "gspo"})
        assert says in paired.provenance(data, found).reused[0]


def test_reproduces_compares_config_base_and_every_logged_value():
    old = {"config": {"seed": 0}, "base": {"sha256": "a"},
           "rows": [{"step": 0, "eval_accuracy": 0.2, "time_total_s": 1.0},
                    {"step": 10, "pg_var": 1e-3}]}
    assert reuse.differs(old, {**old, "rows": [{**old["rows"][0], "time_total_s": 9.0},
                                               old["rows"][1]]}) == (4, "")
    assert reuse.differs(old, {**old, "config": {"seed": 1}}) == (
        0, "its config differs at seed: 1, not 0")
    assert reuse.differs(old, {**old, "config": {}})[1] == \
        "its config differs at seed: 'no such option', not 0"
    # an option added since: the new code's default (the command sets none)
    assert reuse.differs(old, {**old, "config": {"seed": 0, "new": False}})[1] == ""
    assert reuse.differs(old, {**old, "base": None}) == (0, "its base differs")
    assert reuse.differs({**old, "command": "-m t --workdir=a --config.seed=0"},
                         {**old, "command": "-m t --workdir=b --config.seed=0"})[1] == ""
    assert reuse.differs({**old, "command": "-m t --config.seed=0"},
                         {**old, "command": "-m t --config.seed=1"})[1] == "its command differs"
    assert reuse.differs(old, {**old, "rows": old["rows"][:1]})[1] == "1 logged rows, not 2"
    new = {**old, "rows": [old["rows"][0], {"step": 10, "pg_var": 1e-3 + 1e-18}]}
    assert reuse.differs(old, new)[1].startswith("step 10, pg_var")


def test_the_page_and_figure_hold_every_arm(tmp_path):
    _records(tmp_path, {"GSPO": GSPO, "IBPO-GSPO": GSPO[::-1], "peer_steps": GSPO[1:] + [.3]})
    out = tmp_path / "out"
    paths = paired.write(ITEM, paired.records(ITEM, "countdown", tmp_path, 8),
                         task="countdown", out_dir=out, command="cmd", records_dir=tmp_path)
    md = paths[0].read_text()
    assert "| peer_steps | 4 | 30.2 ± 1.7 | 50.0 ± 0.0 | 0.200 ± 0.000 |" in md
    assert "| peer_steps − GSPO (peer_steps) | 4 |" in md
    assert paths[2].stat().st_size > 1000


def test_peer_steps_and_vouched_steps_train_on_countdown_only():
    for label in ("peer_steps", "vouched_steps", "vouched_steps, GSPO's budget"):
        assert label not in [r.label for r in ITEM.runs_on("arith")]
    assert [r.label for r in ITEM.runs_on("countdown")][-3:] == [
        "peer_steps", "vouched_steps, GSPO's budget", "vouched_steps"]
    assert dict(items_oracle.VOUCHED_BUDGET.overrides)["train.budget"] == str(200 * 256)


def test_the_page_gives_the_budget_of_an_arm_that_spends_another(tmp_path):
    _records(tmp_path, {"GSPO": GSPO})
    _records(tmp_path, {"vouched_steps": GSPO}, odd={
        ("vouched_steps", s): {"rows": [{"step": 200, "eval_accuracy": 0.3,
                                         "budget_trajectories": 4.0}]} for s in range(4)})
    for s in range(4):
        path = tmp_path / f"gspo_s{s}.json"
        rec = json.loads(path.read_text())
        rec["rows"][-1]["budget_trajectories"] = 1.0
        path.write_text(json.dumps(rec))
    assert paired._budgets(paired.records(ITEM, "countdown", tmp_path, 8)) == [
        "Budget, mean over seeds at the last row: vouched_steps 200 steps, 4 trajectories "
        "(4.00× GSPO's).", ""]


def test_a_paired_item_trains_seed_major_from_a_clean_tree(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(reproduce, "ensure_runs", lambda jobs, **kw: calls.append(
        ([(r.label, s) for r, s in jobs], kw["records_dir"])))
    monkeypatch.setattr(reproduce, "git_commit", lambda root: ("abc", False))
    reproduce.reproduce(["oracle"], task="arith", seeds=2, parallel=2, smoke=False,
                        out=tmp_path)
    jobs, where = calls[-1]
    assert where == tmp_path / "runs" / "arith" / "paired"
    assert jobs[:5] == [("GSPO", 0), ("IBPO-GSPO", 0), ("oracle, sequence", 0),
                        ("oracle, token", 0), ("GSPO", 1)]
    monkeypatch.setattr(reproduce, "git_commit", lambda root: ("abc", True))
    with pytest.raises(SystemExit, match="clean tree"):
        reproduce.reproduce(["oracle"], task="arith", seeds=2, parallel=2, smoke=False,
                            out=tmp_path)


def test_the_driver_reruns_one_recorded_seed_beside_the_records(tmp_path, monkeypatch):
    records = tmp_path / "runs" / "arith" / "paired"
    records.mkdir(parents=True)
    _records(records, {"GSPO": GSPO[:1]})
    trained = []
    monkeypatch.setattr(reproduce, "git_commit", lambda root: ("abc", False))
    monkeypatch.setattr(reproduce, "_train", lambda job: trained.append(job) or (0, 1.0, ""))
    monkeypatch.setattr(reproduce, "compact", lambda workdir, cmd: {"commit": "abcdef0123456"})
    path = reproduce.rerun("oracle", "GSPO:0", task="arith", out=tmp_path)
    assert path == records / "reruns" / "gspo_s0_abcdef0123.json"
    assert json.loads(path.read_text()) == {"commit": "abcdef0123456"}
    cmd, workdir, _ = trained[0]
    assert workdir.name == "gspo_s0_abc" and workdir.parent.name == "reruns"  # one a commit
    assert "--config.seed=0" in cmd and "--config=configs/gspo.py:arith_tiny" in cmd
    for spec, says in (("GSPO:1", "no record of it"), ("nope:0", "runs: GSPO, IBPO-GSPO"),
                       ("GSPO", "give LABEL:SEED")):
        with pytest.raises(SystemExit, match=says):
            reproduce.rerun("oracle", spec, task="arith", out=tmp_path)
    with pytest.raises(SystemExit, match="not paired"):
        reproduce.rerun("table1", "GSPO:0", task="arith", out=tmp_path)
