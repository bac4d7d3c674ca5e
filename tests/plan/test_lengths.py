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


def test_hand_worked_partial_rollouts_of_one_group_of_two_rows():
    """B = 1 group of rows of 2 and 6 tokens, 2 groups in flight, rounds of 2 tokens on 4
    slots. Step 1: round 1 decodes every row's second token (1 step: the first is the round's
    prefill's), rounds 2 and 3 the long rows' (re-encoding their 2, then 4 tokens so far: 4 + 8
    prefix tokens); both groups finish, the oldest is learned. Step 2 learns the other with no
    round; step 3 is step 1 again. Steps 2-9: 1.5 decode steps, 4 tokens, 6 re-encoded."""
    out = lengths.partial(np.array([2, 6]), 4, group_size=2, round_tokens=2, in_flight=2,
                          steps=9)
    assert (out["decode_steps"], out["tokens"], out["reencoded_tokens"], out["slot_steps"],
            out["wasted_slot_steps"]) == (1.5, 4, 6, 6, 2)
    # With prompts of 3 tokens, each carried row re-encodes its prompt too: 2 rows x 2 rounds
    # on step 1 (and step 3, ...), 6 tokens more a step on average.
    out = lengths.partial(np.array([2, 6]), 4, group_size=2, round_tokens=2, in_flight=2,
                          prompt_len=3, steps=9)
    assert out["reencoded_tokens"] == 6 + 6


def test_partial_rollouts_never_wait_for_the_longest_row():
    """All rows decoding at once (slots = rows): refill cannot help, the step lasts the
    longest row; partial rollouts end the step once B groups are finished and carry the long
    rows over, decoding about as many tokens per step as a batch holds."""
    x = lengths.paper_mix(256, 1024)
    kw = dict(compact=False, group_size=8, round_tokens=256, in_flight=64)
    out = lengths.schedules(x, 256, 1024, **kw)
    assert out["today"]["decode_steps"] == out["refill"]["decode_steps"] == 1023
    assert out["partial"]["decode_steps"] < 0.65 * 1024
    assert out["partial"]["tokens"] == pytest.approx((x - 1).sum(), rel=0.1)
    assert out["partial"]["reencoded_tokens"] > 0
    few = lengths.schedules(x, 32, 1024, **kw)  # 8 calls of 32 rows
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
    assert s["refill"]["step_s"] <= s["today"]["step_s"] <= out["predicted_step_s"] * (1 + 1e-9)
    # Partial rollouts' rounds re-encode their prefixes, priced at the prefill's rate.
    p = s["partial"]
    assert p["reencode_s"] == pytest.approx(p["reencoded_tokens"] * out["prefill_token_s"])
    assert p["reencode_s"] > 0
    assert p["step_s"] - p["reencode_s"] <= s["today"]["step_s"]
    table = subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, text=True,
                           timeout=600).stdout
    assert "responses: paper-like mix" in table and \
        "| refill (rollout.refill, a block of 1) |" in table
    worst = subprocess.run([*cmd, "--lengths=max", "--json"], cwd=root, env=env, check=True,
                           capture_output=True, text=True, timeout=600).stdout
    assert "lengths" not in json.loads(worst)
