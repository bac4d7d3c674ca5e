"""The `prefix_credit` probe (issue #47) on a group built by hand: node classes, members and net
update weights against hand-computed values; the first wrong token against `arith.check`; the
per-class summary and IBPO's concentration; the whole probe on the smoke preset."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from experiments.probes import base_probe, prefix_rules
from experiments.probes import prefix_credit as pc
from ibpo_jax import config
from ibpo_jax.core import losses
from ibpo_jax.data import arith, countdown
from ibpo_jax.data.tokenizer import CharTokenizer
from ibpo_jax.trainer.checkpoint import Checkpointer

ROOT = Path(__file__).parents[2]
S, U, E, C = (pc.CLASSES.index(c) for c in ("shared", "unshared", "post_error", "correct_only"))

# Two right responses, two wrong ones, each wrong at its last token (t = 3). w2 goes the way of
# r0 until its error (a right prefix correct peers share); w3 leaves them after its first token,
# so its tokens 1-2 are right steps no correct peer took. r1 is one token shorter (padding 0).
TOKENS = np.array([[1, 2, 3, 4],   # r0, right
                   [1, 2, 5, 0],   # r1, right, length 3
                   [1, 2, 3, 9],   # w2, wrong from t = 3
                   [1, 6, 7, 8]])  # w3, wrong from t = 3
LENGTHS = np.array([4, 3, 4, 4])
MASK = np.arange(4)[None, :] < LENGTHS[:, None]
CORRECT = np.array([True, True, False, False])
RIGHT = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0]], bool)
A_SEQ = np.array([1.0, 1.0, -0.5, -1.5])  # sequence credit
A_TOK = np.array([[0.8] * 4, [0.8, 0.8, 0.8, 0.0],  # token credit
                  [0.2, 0.2, 0.2, -1.0], [0.1, 0.1, 0.1, -2.0]])


def _loss(name: str) -> losses.LossSpec:
    """The arith runs' loss spec (GSPO, seq_mean_token_mean), as `name`."""
    cfg = config.load(f"{ROOT / 'configs' / 'gspo.py'}:arith_tiny")
    return dataclasses.replace(cfg.loss, name=name)


@pytest.fixture(scope="module")
def table():
    zeros = np.zeros((4, 4), np.float32)
    w = np.stack([np.asarray(losses.token_weights(_loss(name), logp=zeros, old_logp=zeros,
                                                  adv=adv, mask=MASK))
                  for name, adv in (("gspo", A_SEQ), ("gspo_token", A_TOK))])
    # At ratio 1 the loss weighs every token of response i by 1/|y_i| (seq_mean_token_mean).
    np.testing.assert_allclose(w, np.stack([MASK / LENGTHS[:, None]] * 2), rtol=1e-6)
    adv = np.stack([np.broadcast_to(A_SEQ[:, None], (4, 4)), A_TOK])
    return pc.node_table(TOKENS, MASK, CORRECT, RIGHT, adv, w)


def test_node_classes_and_members_by_hand(table):
    assert np.array_equal(table.cls, [[S, S, S, C], [S, S, C, -1], [S, S, S, E], [S, U, U, E]])
    assert np.array_equal(table.members, [[4, 3, 2, 1], [4, 3, 1, 0], [4, 3, 2, 1],
                                          [4, 1, 1, 1]])
    assert np.array_equal(table.right_members, [[2, 2, 1, 1], [2, 2, 1, 0], [2, 2, 1, 0],
                                                [2, 0, 0, 0]])
    assert np.array_equal(table.rep, [[1, 1, 1, 1], [0, 0, 1, 0], [0, 0, 0, 1], [0, 1, 1, 1]])


def test_net_weight_by_hand(table):
    # Σ over the node's members of A_i / |y_i|, e.g. the root: 1/4 + 1/3 - 0.5/4 - 1.5/4.
    seq = [[1 / 12, 11 / 24, 1 / 8, 1 / 4], [1 / 12, 11 / 24, 1 / 3, 0],
           [1 / 12, 11 / 24, 1 / 8, -1 / 8], [1 / 12, -3 / 8, -3 / 8, -3 / 8]]
    tok = [[13 / 24, 31 / 60, 1 / 4, 1 / 5], [13 / 24, 31 / 60, 4 / 15, 0],
           [13 / 24, 31 / 60, 1 / 4, -1 / 4], [13 / 24, 1 / 40, 1 / 40, -1 / 2]]
    np.testing.assert_allclose(table.net, [seq, tok], atol=1e-6)


def test_summary_of_the_hand_group(table):
    rep = np.asarray(table.rep)
    seq, tok = (np.asarray(table.net[k])[rep] for k in range(2))
    # In CREDITS order: the hand sequence credit as GSPO, the token one as IBPO (sequence), and
    # the sequence one again as IBPO (token), which so changes nothing.
    members = np.asarray(table.members)[rep]
    out = pc.summarize(np.asarray(table.cls)[rep], members, np.asarray(table.right_members)[rep],
                       members == 4, np.stack([seq, tok, seq]))
    got = out["classes"]
    assert [got[c]["nodes"] for c in pc.CLASSES] == [3, 2, 2, 2]
    # GSPO already pays for the shared right prefix (1/12, 11/24, 1/8 > 0), not for the
    # unshared one (-3/8 twice).
    assert got["shared"]["gspo"]["ge0"] == 1.0 and got["unshared"]["gspo"]["ge0"] == 0.0
    # Of the shared ones only the root holds the whole group; the other two: 11/24 and 1/8.
    assert got["shared"]["whole"] == pytest.approx(1 / 3)
    assert got["shared"]["gspo_partial"]["n"] == 2
    assert got["shared"]["gspo_partial"]["mean"] == pytest.approx((11 / 24 + 1 / 8) / 2)
    # Token credit against sequence credit on the unshared nodes: each -3/8 -> 1/40.
    change = got["unshared"]["change_ibpo_seq"]
    assert change["rel"] == pytest.approx((3 / 8 + 1 / 40) * 2 / (3 / 4))
    assert change["mean"] == pytest.approx(3 / 8 + 1 / 40)
    # Its share of the whole change, Σ|tok - seq| over the 9 nodes (row-major by rep).
    total = 11 / 24 + 7 / 120 + 1 / 8 + 1 / 20 + 1 / 15 + 1 / 8 + 2 / 5 + 2 / 5 + 1 / 8
    assert change["share"] == pytest.approx(0.8 / total)
    assert got["unshared"]["change_ibpo_token"]["rel"] == 0.0
    assert out["concentration"]["ibpo_token"] == {"nodes": 0.0, "tokens": 0.0}
    assert got["shared"]["members"] == pytest.approx(3.0)
    assert got["shared"]["right_members"] == pytest.approx(5 / 3)


def test_concentration():
    got = pc.concentration(np.array([3.0, 1.0, 0.0, 0.0]), np.array([8, 1, 1, 1]))
    assert got == {"nodes": 0.5, "tokens": pytest.approx(9 / 11)}  # 80 % of 4 needs 3 + 1
    assert pc.concentration(np.zeros(3), np.ones(3)) == {"nodes": 0.0, "tokens": 0.0}


def _part(shared: int, right: int, unshared_ge0: float) -> dict:
    """One seed's part as the report reads it: `shared` of `right` right-prefix tokens shared;
    GSPO >= 0 on 90 % of the shared nodes; IBPO's change on 10 % of the tokens."""
    conc = {"tokens": 0.1, "nodes": 0.1}
    return {"counts": {"right_shared": shared, "right_tokens": right, "right_shared_all": 0,
                       "distinct_correct": 2, "mixed_groups": 1},
            "classes": {"shared": {"gspo": {"n": 5, "ge0": 0.9}, "whole": 0.5,
                                   "gspo_partial": {"n": 2, "ge0": 0.8}},
                        "unshared": {"gspo": {"n": 4, "ge0": unshared_ge0}}},
            "concentration": {"ibpo_seq": conc, "ibpo_token": conc}}


def test_verdict_needs_the_sharing_premise():
    from experiments.reports import prefix_credit_report as rep

    # Every other condition holds; only the share of right-prefix tokens a peer shares moves.
    held = rep.verdict([_part(60, 100, 0.0), _part(50, 100, 0.5)])  # 55 % shared: premise
    assert held["premise"] and held["holds"] and held["shared"] == pytest.approx(0.55)
    failed = rep.verdict([_part(20, 100, 0.0), _part(30, 100, 0.5)])  # 25 %: no peer for most
    assert not failed["premise"] and not failed["holds"]
    assert failed["b_lt0"] == pytest.approx(0.75)  # (1.0 + 0.5) / 2 of unshared nodes < 0
    text = rep._measured("base policy", [_part(20, 100, 0.0), _part(30, 100, 0.5)],
                         prefix_rules.ARITH)
    assert text.startswith("base policy: 25.0 % of the wrong responses' right-prefix tokens")
    assert text.endswith("does not hold on this task: most right-prefix tokens (75.0 %) have no "
                         "correct peer sharing them, and there, under GSPO, 75.0 % of the "
                         "unshared right-prefix nodes carry net weight < 0: exactly the "
                         "situation IBPO targets")
    # No unshared node (its GSPO entry empty) counts as none below 0.
    empty = _part(20, 100, 0.0)
    empty["classes"]["unshared"]["gspo"] = {"n": 0}
    assert rep.verdict([empty])["b_lt0"] == 0.0


def test_first_wrong_token_matches_the_checker():
    tok = CharTokenizer()
    record = arith.make_record(37, "+-*", [48, 19, 2], id="x")
    ref = record["reference"]  # "37+48=85\n85-19=66\n66*2=132\nAnswer: 132"
    texts = [ref, ref + "\n",
             "37+48=85\n85-19=67\n67*2=134\nAnswer: 134",  # wrong arithmetic on line 1
             "37+48=85\n",  # stops early
             "37+48=85\n85-19=66\n66*3=198\nAnswer: 198",  # wrong operand on line 2
             ref + "\n\n",  # a line after the answer
             ref.replace("85-19=66", "85-19=67")]  # a slip, yet the right answer: "correct"
    eos = [True, True, True, True, True, False, True]  # row 5 is cut short, no EOS
    rows = [tok.encode(t) + ([tok.eos_id] if e else []) for t, e in zip(texts, eos)]
    lengths = np.array([len(r) for r in rows])
    tokens = np.zeros((len(rows), lengths.max() + 2), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    checks = [arith.check(t, record) for t in texts]
    correct = np.array([c.correct for c in checks])
    infos = [{"first_wrong_step": c.first_wrong_step} for c in checks]
    got = pc.truth(tok, [record] * len(rows), tokens, lengths, correct, infos)
    assert list(correct) == [True, True, False, False, False, False, True]
    first = got.right.argmin(axis=1)  # the first token not right
    assert list(first[2:6]) == [len("37+48=85\n85-19=6"), len("37+48=85\n"),
                                len("37+48=85\n85-19=66\n66*"), len(ref + "\n")]
    # Correct rows count as right throughout; the one off the reference is counted.
    assert got.right[[0, 1, 6]].all() and got.mismatch == 0 and got.off_reference == 1
    # The checker's lines: row 2 is wrong from line 1 on, row 4 from line 2 on.
    assert got.right_step[2].argmin() == len("37+48=85\n")
    assert got.right_step[4].argmin() == len("37+48=85\n85-19=66\n")


# countdown: many right solutions, so "right so far" = the text can still become one (prefix_rules).
CD = {"numbers": [3, 5, 7, 9], "target": 42, "max_value": 99}
CD_ROWS = [  # (text, ends with EOS, right symbols (EOS counts one): hand-worked)
    ("9-3=6\n7*6=42\nAnswer: 42", True, 24),  # right: 23 characters and EOS
    ("9+5=14\n14*3=42\nAnswer: 42\n", True, 27),  # another right solution, final newline
    ("5+9=14\n3*14=42\nAnswer: 42", True, 26),  # the same solution, operands swapped
    ("9-3=7\n6*7=42\nAnswer: 42", True, len("9-3=")),  # wrong arithmetic: at the 7
    ("9-3=6\n8*6=48\nAnswer: 48", True, len("9-3=6\n")),  # 8 is not available
    # A right-looking step after which 42 is out of reach ({3, 5, 16}): "9+" starts 9+5=14.
    ("9+7=16\n16*3=48\nAnswer: 48", True, len("9+")),
    ("9-3=6\n7*6=42\nAnswer: 41", True, len("9-3=6\n7*6=42\nAnswer: 4")),
    ("Answer: 42", True, 0),  # before reaching it
    ("9-3=6\n7*6=4\nAnswer: 4", True, len("9-3=6\n7*6=4")),  # a prefix of 7*6=42, then \n
    ("9-3=6\n", True, len("9-3=6\n")),  # EOS after a step: the EOS is wrong
    ("9-3=6\n7*6=42\nAnswer: 42\n\n", True, len("9-3=6\n7*6=42\nAnswer: 42\n")),
    ("9-3=6\n7*", False, len("9-3=6\n7*"))]  # cut short, right so far


def test_countdown_right_prefix_by_hand():
    tok, rule = CharTokenizer(), prefix_rules.rule_for("countdown")
    rows = [tok.encode(t) + ([tok.eos_id] if e else []) for t, e, _ in CD_ROWS]
    assert [rule.right_tokens(tok, CD, r) for r in rows] == [k for _, _, k in CD_ROWS]
    # Every right next line is one the checker accepts; 9+7=16 and 8*6=48 are not among them.
    first = prefix_rules.next_lines((3, 5, 7, 9), 42, 99, ())
    assert {"9-3=6", "9+5=14", "5+9=14"} <= first and "9+7=16" not in first
    assert "Answer: 42" not in first and "Answer: 42" in prefix_rules.next_lines(
        (3, 5, 7, 9), 42, 99, ("9-3=6", "7*6=42"))
    assert "8*6=48" not in prefix_rules.next_lines((3, 5, 7, 9), 42, 99, ("9-3=6",))
    lengths = np.array([len(r) for r in rows])
    tokens = np.zeros((len(rows), lengths.max()), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    checks = [countdown.check(t, CD) for t, _, _ in CD_ROWS]
    correct = np.array([c.correct for c in checks])
    assert list(np.nonzero(correct)[0]) == [0, 1, 2]
    got = prefix_rules.truth(tok, [CD] * len(rows), tokens, lengths, correct,
                             [{"first_wrong_step": c.first_wrong_step} for c in checks], rule)
    assert list(got.right.sum(1)[3:]) == [k for _, _, k in CD_ROWS[3:]]
    # The first wrong token lies on the checker's first wrong line, except for the cut-short
    # row (the checker calls its partial line malformed; the rule, right so far).
    assert got.mismatch == 1 and got.off_reference == 0
    assert got.right_step[4].argmin() == len("9-3=6\n")  # checker: line 1
    # Distinct right solutions of a group (rows 0-3): 9-3=6.. and 9+5=14.. (row 2 is row 1's
    # solution in other words): 2 solutions, 3 texts.
    ok, mixed = correct[None, :4], np.array([True])
    assert pc.distinct_correct(tokens, lengths, ok, mixed,
                               lambda ids: rule.solution(tok, ids)) == 2
    assert pc.distinct_correct(tokens, lengths, ok, mixed) == 3
    with pytest.raises(ValueError, match="valid: arith, countdown"):
        prefix_rules.rule_for("math")


def test_probe_end_to_end_on_the_smoke_preset(tmp_path, monkeypatch):
    # A base of its own: the worker's shared smoke base is warm-started by whichever test
    # comes first (one device or eight, in a subprocess or not), and 4 groups of 4 of another
    # base need not hold a mixed group (seen in a full run).
    monkeypatch.setenv("IBPO_DATA_DIR", str(tmp_path / "data"))
    extra, runs = (("train.steps", "1"),), tmp_path / "runs"
    # "Final" GSPO and IBPO-GSPO policies of run seed 5: the smoke base, saved at the last step.
    cfg = config.load(f"{ROOT / 'configs' / 'gspo.py'}:smoke", [*extra, ("seed", "5")])
    with base_probe.base_trainer(cfg) as (trainer, _):
        for algo in pc.RUNS.values():
            ckpt = Checkpointer(runs / f"{algo}_s5" / "checkpoints")
            ckpt.save(1, trainer.state, {"config": {"algo": algo, "seed": 5}})
            ckpt.close()
    files = pc.reproduce(preset="smoke", extra=extra, seeds=1, records_dir=tmp_path / "rec",
                         out_dir=tmp_path / "out", runs_dir=runs, command="cmd", batches=1)
    rec = json.loads((tmp_path / "rec" / "prefix_credit_s0.json").read_text())
    assert rec["trained"]["run_seed"] == 5 and rec["seed"] == 0
    for part in (rec["base_policy"], *(rec["trained"][label] for label in pc.RUNS)):
        n = part["counts"]
        assert n["responses"] == 16 and n["checker_mismatch"] == 0 and n["mixed_groups"] >= 1
        assert 0 < n["right_shared_all"] <= n["right_shared"] <= n["right_tokens"]
        assert n["mixed_groups"] + n["no_right_groups"] <= n["groups"] == 4
        # Every node of the mixed groups is in one class and one histogram bin per credit.
        nodes = sum(part["classes"][c]["nodes"] for c in pc.CLASSES)
        for cred in pc.CREDITS:
            assert sum(sum(part["hist"][c][cred]) for c in pc.CLASSES) == nodes > 0
    md = (tmp_path / "out" / "prefix_credit.md").read_text()
    assert "run seeds 5" in md and "**Measured**, base policy" in md
    assert [f.name for f in files] == ["prefix_credit.md", "prefix_credit.json",
                                       "prefix_credit.png"]
    assert (tmp_path / "out" / "prefix_credit.png").stat().st_size > 1000
