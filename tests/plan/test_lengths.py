"""Decode steps under a response-length distribution (plan/lengths.py): hand-worked schedules,
the stated paper-like mix, lengths matching a run's metrics, and the plan's step time."""

import json

import numpy as np
import pytest

from ibpo_jax import config
from ibpo_jax.plan import lengths


def test_hand_worked_schedules_of_four_rows_on_two_slots():
    """Rows of 4, 2, 2, 2 tokens on 2 slots; each row's first token is its prefill's, so the
    decode loop makes 3, 1, 1, 1. Today: calls [4, 2] then [2, 2], each as long as its longest
    row: 3 + 1 = 4 decode steps, 8 slot-steps for 6 tokens. Refill: one slot decodes the long
    row while the other takes the three short ones in turn: 3 steps, none wasted."""
    x = np.array([4, 2, 2, 2])
    today = lengths.today(x, 2, 16, compact=False)
    assert (today["decode_steps"], today["slot_steps"], today["tokens"],
            today["wasted_slot_steps"]) == (4, 8, 6, 2)
    assert today["row_steps"] == 8  # no compaction: every slot runs every step
    refill = lengths.refill(x, 2)
    assert (refill["decode_steps"], refill["wasted_slot_steps"]) == (3, 0)
    start, end = lengths._refill(x - 1, 2)
    assert start.tolist() == [0, 0, 1, 2] and end.tolist() == [3, 1, 2, 3]


def test_partial_rollouts_never_wait_for_the_longest_row():
    """All rows in flight at once (slots = rows): refill cannot help, the step lasts the
    longest row; partial rollouts end the step once a batch is finished and carry the long
    rows over, decoding about as many tokens per step as a batch holds."""
    x = lengths.paper_mix(256, 1024)
    out = lengths.schedules(x, 256, 1024, compact=False)
    assert out["today"]["decode_steps"] == out["refill"]["decode_steps"] == 1023
    assert out["partial"]["decode_steps"] < 0.6 * 1024
    assert out["partial"]["wasted_slot_steps"] == 0
    assert out["partial"]["tokens"] == pytest.approx((x - 1).sum(), rel=0.1)
    few = lengths.schedules(x, 32, 1024, compact=False)  # 8 calls of 32 rows
    assert few["partial"]["decode_steps"] <= few["refill"]["decode_steps"] \
        < 0.6 * few["today"]["decode_steps"]


def test_the_paper_mix_is_the_stated_one():
    x = lengths.paper_mix(1000, 8192)
    assert len(x) == 1000 and x.min() >= 1 and x.max() == 8192
    assert np.mean(x == 8192) == pytest.approx(0.6 * 0.5, abs=0.01)  # half the wrong ones
    right = np.sort(x)[:400]
    assert np.median(x) < 0.5 * 8192 and right.max() < 0.35 * 8192 * 1.6


def test_lengths_from_a_runs_metrics_match_its_mean_and_truncation(tmp_path):
    rows = [{"step": s, "response_len_mean": 30.0 + s % 2, "frac_truncated": 0.25}
            for s in range(1, 21)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"step": 0}, *rows]))
    x = lengths.from_metrics(path, 400, 64)
    assert np.mean(x == 64) == 0.25 and x.mean() == pytest.approx(30.5, rel=0.03)
    (tmp_path / "empty.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(ValueError, match="empty.jsonl: no row with response_len_mean"):
        lengths.from_metrics(tmp_path / "empty.jsonl", 4, 64)


def test_step_time_swaps_the_worst_case_decode_for_each_schedule(tmp_path):
    cfg = config.load("configs/ibpo_gspo.py:smoke")
    r = cfg.rollout
    x = lengths.load("paper", cfg)
    assert len(x) == r.prompts_per_step * r.group_size
    out = lengths.step_times("paper", x, cfg, decode_step_s=0.5, decode_runs=100.0, step_s=60.0)
    assert out["slots"] == (r.sample_chunk or r.prompts_per_step) * r.group_size
    for c in out["schedules"].values():
        assert c["step_s"] == pytest.approx(60.0 - 50.0 + 0.5 * c["decode_steps"])
    for source, message in (("uniform", "expected paper, max or metrics:PATH"),
                            (f"metrics:{tmp_path}/none.jsonl", "No such file")):
        with pytest.raises(ValueError, match=message):
            lengths.load(source, cfg)


def test_the_plan_prints_the_step_under_the_lengths_and_max_leaves_it_out():
    """`python -m ibpo_jax.plan ... --lengths=...` on the smoke config: the JSON's lengths
    section (refill and partial never slower than today, today never slower than the worst
    case) and the table's three rows; --lengths=max prints the worst case only."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    cmd = [sys.executable, "-m", "ibpo_jax.plan", "--config=configs/ibpo_gspo.py:smoke",
           "--hardware=h100", "--devices=1"]
    out = json.loads(subprocess.run([*cmd, "--json"], cwd=root, env=env, check=True,
                                    capture_output=True, text=True, timeout=600).stdout)
    s = out["lengths"]["schedules"]
    assert s["partial"]["step_s"] <= s["refill"]["step_s"] <= s["today"]["step_s"] \
        <= out["predicted_step_s"] * (1 + 1e-9)
    table = subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, text=True,
                           timeout=600).stdout
    assert "responses: paper-like mix" in table and \
        "| refill (rollout.refill, a block of 1) |" in table
    worst = subprocess.run([*cmd, "--lengths=max", "--json"], cwd=root, env=env, check=True,
                           capture_output=True, text=True, timeout=600).stdout
    assert "lengths" not in json.loads(worst)
