"""Appendix B's correction rollouts (methods/corrections.py): who gets a correction and with
which peer, and the prompt templates of the second rounds (data/followups.py)."""

import numpy as np
import pytest

from ibpo_jax.config.registry import PROCEDURAL
from ibpo_jax.data import followups, tasks
from ibpo_jax.methods import corrections


def test_correction_pairs_pick_each_wrong_row_and_a_correct_peer_of_its_group():
    correct = np.array([[True, False, False, True],  # two wrong, two possible peers
                        [False, False, False, False],  # no correct response: nothing to do
                        [True, True, True, True],  # nothing wrong
                        [False, True, False, False]])
    wrong, peers = corrections.correction_pairs(correct, np.random.default_rng(0))
    np.testing.assert_array_equal(wrong, [1, 2, 12, 14, 15])
    assert set(peers[:2]) <= {0, 3} and list(peers[2:]) == [13, 13, 13]
    flat = correct.reshape(-1)
    assert not flat[wrong].any() and flat[peers].all()
    assert (wrong // 4 == peers // 4).all()  # a peer of the same group
    # The draw is uniform over the group's correct responses.
    draws = [corrections.correction_pairs(correct, np.random.default_rng(s))[1][0]
             for s in range(400)]
    assert 0.4 < np.mean(np.array(draws) == 0) < 0.6


def test_correction_pairs_of_a_batch_without_wrong_rows_are_empty():
    wrong, peers = corrections.correction_pairs(np.ones((2, 4), bool), np.random.default_rng(0))
    assert wrong.shape == peers.shape == (0,)


def _task(reward):
    return tasks.Task(name="t", reward=reward, splits={}, prompt_fn=str,
                      reference_fn=lambda r: None, question_fn=lambda r: r["q"],
                      wrap_fn=lambda text: f"<user>{text}</user>")


@pytest.mark.parametrize("family", ["arith", "math", "code"])
def test_templates_quote_the_problem_and_the_responses_inside_the_chat_wrapper(family):
    task = _task(family)
    text = followups.correction_prompt(task, {"q": "Q?"}, wrong="W1", right="R1")
    assert text.startswith("<user>Q?") and text.endswith("</user>")
    assert text.index("W1") < text.index("R1")
    retry = followups.retry_prompt(task, {"q": "Q?"}, attempt="A1")
    assert retry.startswith("<user>Q?") and "A1" in retry


def test_a_family_without_a_template_is_named():
    with pytest.raises(ValueError, match="no correction template; families with one: arith"):
        followups.correction_prompt(_task("poetry"), {"q": ""}, wrong="", right="")


def test_arith_templates_use_only_the_char_tokenizer_alphabet():
    from ibpo_jax.data.tokenizer import CharTokenizer

    tok = CharTokenizer()
    arith = PROCEDURAL.get("arith")
    for template in (arith.correction, arith.retry):
        tok.encode(template.format(question="Start with 3.", wrong="3+1=4",
                                   right="3+1=4", attempt="3+1=4"))  # raises if not
