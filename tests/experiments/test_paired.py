"""The paired design (issue 57): paired t against scipy, the page's pairs, its refusal to pair
records of different commits or hosts, and the driver's seed-major, clean-tree training."""

import json
import math
from pathlib import Path

import pytest
from scipy import stats as sp

from experiments import items_oracle, reproduce
from experiments.reports import paired, stats

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
    rows = paired.compare(data, refused=False)
    assert [r["finding"] for r in rows] == ["level"] * 4  # no peer_steps on arith
    assert paired.answer(rows).startswith("(b)")
    # the oracle gains 5 points on every seed (± noise), IBPO nothing
    _records(tmp_path, {"oracle, sequence": [g + 0.05 + e for g, e in zip(GSPO, noise)]})
    rows = paired.compare(paired.records(ITEM, "arith", tmp_path, 8), refused=False)
    found = {(r["a"], r["b"]): r for r in rows}
    assert found[("oracle, sequence", "GSPO")]["finding"] == "higher"
    assert found[("oracle, sequence", "GSPO")]["test"].diff == pytest.approx(0.05)
    assert paired.answer(rows).startswith("(a)")


def test_a_seed_whose_arms_differ_in_commit_host_or_cleanliness_is_not_paired(tmp_path):
    finals = {"GSPO": GSPO, "oracle, sequence": [x + 0.05 for x in GSPO]}
    _records(tmp_path, finals, odd={("GSPO", 2): {"commit": "deadbeef"}})
    data = paired.records(ITEM, "arith", tmp_path, 8)
    groups, why, bad = paired.provenance(data)
    assert len(groups) == 2 and not why and set(bad) == {2} and "2 (commit, host)" in bad[2]
    rows = paired.compare(data, refused=False, left_out=set(bad))
    assert rows[0]["seeds"] == [0, 1, 3]
    out = tmp_path / "out"
    paired.write(ITEM, data, task="arith", out_dir=out, command="cmd", records_dir=tmp_path)
    md = (out / "oracle.md").read_text()
    assert "**Seed 2 left out of every pair:** its arms ran on 2 (commit, host)" in md
    assert "| oracle, sequence − GSPO (oracle credit, sequence level) | 3 |" in md
    # a seed's arms on another host, together: paired (hosts may differ between seeds)
    _records(tmp_path, finals, odd={(label, 1): {"cpu": "cpu B"} for label in finals})
    assert paired.provenance(paired.records(ITEM, "arith", tmp_path, 8))[2] == {}
    # a dirty record: its seed left out
    _records(tmp_path, finals, odd={("oracle, sequence", 1): {"dirty": True}})
    assert "dirty" in paired.provenance(paired.records(ITEM, "arith", tmp_path, 8))[2][1]
    # whole seeds at another commit: nothing paired, said
    _records(tmp_path, finals, odd={(label, 3): {"commit": "beef"} for label in finals})
    data = paired.records(ITEM, "arith", tmp_path, 8)
    why = paired.provenance(data)[1]
    assert "2 commits" in why
    paired.write(ITEM, data, task="arith", out_dir=out, command="cmd", records_dir=tmp_path)
    assert "refused (provenance)" in (out / "oracle.md").read_text()
    assert "not answered yet" in json.loads((out / "oracle.json").read_text())["why"]


def test_the_page_and_figure_hold_every_arm(tmp_path):
    _records(tmp_path, {"GSPO": GSPO, "IBPO-GSPO": GSPO[::-1], "peer_steps": GSPO[1:] + [.3]})
    out = tmp_path / "out"
    paths = paired.write(ITEM, paired.records(ITEM, "countdown", tmp_path, 8),
                         task="countdown", out_dir=out, command="cmd", records_dir=tmp_path)
    md = paths[0].read_text()
    assert "| peer_steps | 4 | 30.2 ± 1.7 | 50.0 ± 0.0 | 0.200 ± 0.000 |" in md
    assert "| peer_steps − GSPO (peer_steps) | 4 |" in md
    assert paths[2].stat().st_size > 1000


def test_peer_steps_trains_on_countdown_only():
    assert "peer_steps" not in [r.label for r in ITEM.runs_on("arith")]
    assert [r.label for r in ITEM.runs_on("countdown")][-1] == "peer_steps"


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
