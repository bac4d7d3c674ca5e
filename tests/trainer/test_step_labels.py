"""What the checker and peer_steps operators read (issue 57): the checker's first wrong line as
a step index (tokens too), the task's canonical step ids, and the start-up refusal."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax.config.sections import ConfigError, IbpoConfig
from ibpo_jax.core import comparison
from ibpo_jax.data import countdown, tasks
from ibpo_jax.trainer import credit, step_labels


def test_truth_steps_counts_the_non_empty_lines_before_the_wrong_one():
    texts = ["a\n\nb\nc", "a\nb", "x\ny\n"]
    infos = [{"first_wrong_step": 3}, {"first_wrong_step": None}, {"first_wrong_step": 1}]
    # line 3 ("c") follows "a", "" (no step) and "b": step 2
    np.testing.assert_array_equal(step_labels.truth_steps(texts, infos), [2, -1, 1])


def test_canonical_ids_match_commutative_forms_and_keep_the_budget():
    ids, count = step_labels.canonical_ids(
        ["3+5=8\n8*2=16\nAnswer: 16", "5+3=8\n\n2*8=16", "5-3=2"], countdown.canonical_step, 2)
    np.testing.assert_array_equal(count, [2, 2, 1])
    np.testing.assert_array_equal(ids[0], ids[1])  # the same steps written the other way round
    assert ids[2, 0] != ids[0, 0] and ids[2, 1] == 0
    assert countdown.canonical_step("3*9=27") == "9*3=27"
    assert countdown.canonical_step("3-9=6") == "3-9=6"  # not commutative: as written
    assert countdown.canonical_step("Answer: 7") == "Answer: 7"


def _rollout(response, lengths, ended, **labels):
    response = jnp.asarray(response, jnp.int32)
    n = response.shape[0]
    return credit.Rollout(prompt=response[:, :1], prompt_len=jnp.ones(n, jnp.int32),
                          response=response, response_len=jnp.asarray(lengths, jnp.int32),
                          sample_logp=jnp.zeros(response.shape), reward=jnp.zeros(n),
                          correct=jnp.zeros(n, bool), ended=jnp.asarray(ended), **labels)


def test_checker_truth_in_steps_and_in_tokens():
    is_delim = jnp.array([False, True, False, False, False])  # token 1 is the newline
    eos = 4
    # row 0: "2 3 \n 2 2 \n 3 EOS", first wrong step 1 -> 3 tokens before it (the newline
    # ends step 0); row 1: a leading newline, first wrong step 0 -> 1 token before it;
    # row 2: no wrong step named -> -1.
    r = _rollout([[2, 3, 1, 2, 2, 1, 3, eos], [1, 2, 3, 1, 2, eos, 0, 0],
                  [2, 1, 3, 0, 0, 0, 0, 0]], [8, 6, 3], [True, True, False],
                 step_truth=jnp.array([1, 0, -1], jnp.int32))
    token = types.SimpleNamespace(ibpo=IbpoConfig(granularity="token"))
    step = types.SimpleNamespace(ibpo=IbpoConfig(granularity="step"))
    np.testing.assert_array_equal(credit.checker_truth(token, r, is_delim), [3, 1, -1])
    np.testing.assert_array_equal(credit.checker_truth(step, r, is_delim), [1, 0, -1])
    with pytest.raises(ValueError, match="checker labels"):
        credit.checker_truth(step, r._replace(step_truth=None), is_delim)


def test_compared_units_fall_back_where_the_step_counts_differ():
    is_delim = jnp.array([False, True, False, False])
    r = _rollout([[2, 1, 3, 0], [2, 3, 0, 0]], [3, 2], [False, False],
                 step_ids=jnp.array([[7, 8], [9, 9]], jnp.int32),
                 step_ids_len=jnp.array([2, 2], jnp.int32))  # row 1 has one step, not two
    u = comparison.response_units(r.response, r.response_len, r.ended, is_delim)
    units, fallback = credit.compared_units(IbpoConfig(operator="peer_steps"), r, u)
    np.testing.assert_array_equal(units[0], [7, 8])
    np.testing.assert_array_equal(units[1], u.units[1])
    np.testing.assert_array_equal(fallback, [False, True])
    other = IbpoConfig(operator="lcs_first_error")
    np.testing.assert_array_equal(credit.compared_units(other, r, u)[0], u.units)


def test_checker_operator_on_a_task_without_step_checker_is_one_line():
    task = tasks.Task(name="math500", reward="math_answer", splits={}, prompt_fn=str,
                      reference_fn=lambda r: None)
    with pytest.raises(ConfigError, match="task 'math500' has no checker"):
        step_labels.check_task(IbpoConfig(operator="checker"), task)
    step_labels.check_task(IbpoConfig(operator="lcs_first_error"), task)  # no need: fine
