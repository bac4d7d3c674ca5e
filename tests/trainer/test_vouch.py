"""The `vouched_steps` operator's host side (trainer/vouch.py): step-end columns, the prefixes
it samples, the vouched counts from a stand-in sampler and judge worked by hand, the config's
refusals, and one training step of the smoke run."""

import types

import jax
import numpy as np
import pytest

from ibpo_jax import config
from ibpo_jax.config.sections import ConfigError, IbpoConfig
from ibpo_jax.trainer import loop, vouch

NL, EOS, PAD = 1, 9, 0
IS_DELIM = np.array([False, True] + [False] * 8)  # token 1 is the newline


def test_step_end_columns_close_each_non_empty_step():
    # "2 3 \n \n 4 \n 5": steps end at the newline after 3 (col 2), after 4 (col 5), and at 5
    # (col 6, no newline after it); the empty line is no step.
    tokens = np.array([2, 3, NL, NL, 4, NL, 5, EOS])
    np.testing.assert_array_equal(vouch.step_end_columns(tokens, 7, IS_DELIM), [2, 5, 6])
    np.testing.assert_array_equal(vouch.step_end_columns(tokens, 3, IS_DELIM), [2])
    np.testing.assert_array_equal(vouch.step_end_columns(np.array([NL, NL]), 2, IS_DELIM), [])
    # Ids outside the vocabulary are no delimiters (as units.split_steps).
    np.testing.assert_array_equal(vouch.step_end_columns(np.array([-1, NL, 99]), 3, IS_DELIM),
                                  [1, 2])


K = 3


def _generate(params, prompts, lengths, key):
    """Stand-in sampler: K continuations "7 EOS" of every prompt (rows prompt-major)."""
    del params, lengths, key
    n = prompts.shape[0] * K
    return types.SimpleNamespace(tokens=np.tile([[7, EOS]], (n, 1)), lengths=np.full(n, 2))


def test_vouched_walks_on_from_the_peers_first_error_while_a_continuation_is_right():
    # Row 0 "a\nb\nc\nd" (4 steps, peers vouch for 1): round 0 tests the prefix through b,
    # which the judge accepts (a continuation of those 4 tokens), round 1 the prefix through c,
    # which it does not: v = 2, two prefixes. Row 1 (peers 0, 3 steps): its first prefix is
    # judged wrong, so the walk stops there: v = peers' 0, one prefix. Row 2 is not scored:
    # nothing sampled. Row 3's prefix with its longer prompt does not fit the width (3 + 6 > 8):
    # dropped. Row 4 (peers 3 of 4 steps): nothing left to test before its last step.
    response = np.array([[2, NL, 3, NL, 4, NL, 5, EOS],
                         [2, NL, 3, NL, 4, EOS, PAD, PAD],
                         [2, NL, 3, NL, 4, NL, 5, EOS],
                         [2, 2, 2, 2, 2, NL, 3, EOS],
                         [2, NL, 3, NL, 4, NL, 5, EOS]])
    response_len, ended = np.array([8, 6, 8, 8, 8]), np.ones(5, bool)
    prompt, prompt_len = np.full((5, 3), 8), np.array([2, 2, 2, 3, 2])
    seen = []

    def judge(rows, tokens, lengths):
        seen.extend(zip(rows.tolist(), lengths.tolist()))
        return (rows == 0) & (lengths == 4 + 2)  # "2 \n 3 \n" + "7 EOS", not "... 4 \n"

    v = vouch.Vouch(_generate, IbpoConfig(operator="vouched_steps", completions=K), 5,
                    IS_DELIM, width=8, chunk=2, pad_id=PAD)
    out, metrics = vouch.vouched(
        v, params=None, prompt=prompt, prompt_len=prompt_len, response=response,
        response_len=response_len, ended=ended, first=np.array([1, 0, 0, 0, 3]),
        n_steps=np.array([4, 3, 4, 2, 4]), scored=np.array([True, True, False, True, True]),
        judge=judge, key=jax.random.key(0))
    np.testing.assert_array_equal(out, [2, 0, 0, 0, 0])
    # Continuations of row 0 through b (4 + 2 tokens) and c (6 + 2), of row 1 through a (2 + 2).
    assert sorted(set(seen)) == [(0, 6), (0, 8), (1, 4)]
    assert metrics == {"vouch_prefixes": 3.0, "vouch_completions": 3.0 * K,
                       "vouch_prefixes_dropped": 1.0, "vouch_rounds": 2.0,
                       "vouch_moved_frac": 1 / 4}


def test_config_refusals_are_one_line():
    with pytest.raises(ConfigError, match="ibpo.granularity.*vouched_steps"):
        IbpoConfig(operator="vouched_steps", granularity="token").check()
    with pytest.raises(ConfigError, match="ibpo.completions"):
        IbpoConfig(operator="vouched_steps", completions=0).check()
    with pytest.raises(ConfigError, match="vouched_steps.*extra round"):
        config.load("configs/ibpo_gspo.py:smoke", [("ibpo.operator", "vouched_steps"),
                                                    ("ibpo.correction_rollouts", "True")])


def test_a_sampler_call_takes_as_many_prefixes_as_the_rollouts_chunk():
    """rollout.sample_chunk, the knob that fits a sampler call in memory, sizes the
    continuation calls too (prefixes are P + R wide: wider than the rollout's prompts)."""
    tok = types.SimpleNamespace(is_delim=IS_DELIM, pad_id=PAD)
    for chunk, want in ((0, 4), (2, 2)):
        cfg = config.load("configs/ibpo_gspo.py:smoke", [("ibpo.operator", "vouched_steps"),
                                                          ("rollout.sample_chunk", str(chunk))])
        v = vouch.build(cfg.ibpo, cfg.rollout, generate=None, tokenizer=tok)
        assert (v.chunk, v.width) == (want, 64 + 40)


def test_a_training_step_charges_the_continuations_to_the_budget(smoke_data_dir, tmp_path):
    cfg = config.load("configs/ibpo_gspo.py:smoke", [
        ("task.data_dir", str(smoke_data_dir)), ("train.steps", "1"),
        ("ibpo.operator", "vouched_steps"), ("ibpo.completions", "2")])
    step = loop.run(cfg, workdir=tmp_path)[-1]
    assert step["vouch_completions"] == 2 * step["vouch_prefixes"] > 0
    assert step["budget_trajectories"] == cfg.rows_per_step + step["vouch_completions"]
    # Whether a continuation moves a first error depends on the tiny policy's samples; where
    # they move is worked by hand above.
    assert 0 <= step["vouch_moved_frac"] <= 1 and step["vouch_rounds"] >= 1
    assert step["time_vouch_s"] > 0
    assert np.isfinite(step["grad_norm"]) and 0 <= step["phi_mean"] <= 1
