"""Second rounds (trainer/rounds.py): who gets a correction, the slot layout, the joined
update rows, and the prompt templates (data/followups.py)."""

import numpy as np
import pytest

from ibpo_jax.data import followups, tasks
from ibpo_jax.trainer import rounds


def test_correction_pairs_pick_each_wrong_row_and_a_correct_peer_of_its_group():
    correct = np.array([[True, False, False, True],  # two wrong, two possible peers
                        [False, False, False, False],  # no correct response: nothing to do
                        [True, True, True, True],  # nothing wrong
                        [False, True, False, False]])
    wrong, peers = rounds.correction_pairs(correct, np.random.default_rng(0))
    np.testing.assert_array_equal(wrong, [1, 2, 12, 14, 15])
    assert set(peers[:2]) <= {0, 3} and list(peers[2:]) == [13, 13, 13]
    flat = correct.reshape(-1)
    assert not flat[wrong].any() and flat[peers].all()
    assert (wrong // 4 == peers // 4).all()  # a peer of the same group
    # The draw is uniform over the group's correct responses.
    draws = [rounds.correction_pairs(correct, np.random.default_rng(s))[1][0] for s in range(400)]
    assert 0.4 < np.mean(np.array(draws) == 0) < 0.6


def test_correction_pairs_of_a_batch_without_wrong_rows_are_empty():
    wrong, peers = rounds.correction_pairs(np.ones((2, 4), bool), np.random.default_rng(0))
    assert wrong.shape == peers.shape == (0,)


@pytest.mark.parametrize("m, n, want", [(0, 64, 8), (1, 64, 8), (16, 64, 16), (17, 64, 24),
                                        (64, 64, 64), (3, 2, 3)])
def test_padded_count_rounds_up_to_a_few_shapes(m, n, want):
    assert rounds.padded_count(m, n) == want


def _sampled(m, width=5, r=3):
    prompt = np.arange(m * width, dtype=np.int32).reshape(m, width) + 10
    return rounds.Sampled(prompt, np.full(m, 4, np.int32), np.full((m, r), 7, np.int32),
                          np.arange(1, m + 1, dtype=np.int32), np.full((m, r), -0.5, np.float32),
                          0)


def test_slot_arrays_put_each_result_at_its_row_and_leave_the_rest_invalid():
    got = _sampled(2)
    out = rounds.slot_arrays(6, np.array([4, 1]), got, np.array([1.0, -1.0]),
                             np.array([True, False]), np.array([True, True]), pad_id=0)
    np.testing.assert_array_equal(out["valid"], [0, 1, 0, 0, 1, 0])
    np.testing.assert_array_equal(out["prompt"][4], got.prompt[0])
    np.testing.assert_array_equal(out["prompt"][1], got.prompt[1])
    np.testing.assert_array_equal(out["response_len"], [0, 2, 0, 0, 1, 0])
    np.testing.assert_array_equal(out["reward"], [0, -1, 0, 0, 1, 0])
    np.testing.assert_array_equal(out["correct"], [0, 0, 0, 0, 1, 0])
    invalid = ~out["valid"]
    assert (out["prompt_len"][invalid] == 1).all() and (out["prompt"][invalid] == 0).all()
    assert (out["sample_logp"][invalid] == 0).all()


def test_joined_rows_left_pad_the_first_round_prompts_to_the_second_round_width():
    import jax

    from ibpo_jax import sharding

    n, r = 4, 3
    first = rounds.FirstRound(
        records=[{}], prompt=np.array([[0, 5, 6]] * n, np.int32), prompt_len=np.full(n, 2),
        response=np.ones((n, r), np.int32), response_len=np.full(n, 3),
        sample_logp=np.zeros((n, r), np.float32), reward=np.array([1, -1, -1, 1], np.float32),
        correct=np.array([1, 0, 0, 1], bool), ended=np.ones(n, bool), texts=[""] * n)
    second = rounds.slot_arrays(n, np.array([1, 2]), _sampled(2), np.zeros(2), np.zeros(2, bool),
                                np.ones(2, bool), pad_id=0)
    mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
    out = rounds.joined(first, second, mesh, pad_id=0, kl_anchor=np.arange(2 * n))
    prompt = np.asarray(out.prompt)
    assert prompt.shape == (2 * n, 5)
    np.testing.assert_array_equal(prompt[0], [0, 0, 0, 5, 6])  # left padding keeps the end
    np.testing.assert_array_equal(prompt[n + 1], second["prompt"][1])
    np.testing.assert_array_equal(np.asarray(out.valid), [1, 1, 1, 1, 0, 1, 1, 0])
    np.testing.assert_array_equal(np.asarray(out.kl_anchor), np.arange(8))
    assert isinstance(out.reward, jax.Array)


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
    for table in (followups.CORRECTION, followups.RETRY):
        tok.encode(table["arith"].format(question="Start with 3.", wrong="3+1=4",
                                         right="3+1=4", attempt="3+1=4"))  # raises if not
