"""Dynamic sampling's group choice, DAPO's overlong shaping and filter (trainer/dynamic.py),
and the "phantom advantage" claim on the real credit path, against numbers worked by hand."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import config, models
from ibpo_jax.config.schema import ConfigError
from ibpo_jax.core import advantages
from ibpo_jax.trainer import dynamic, packing, step, step_records
from ibpo_jax.trainer.state import init_state, make_optimizer
from tests.trainer.test_step import (
    ARCH,
    GROUP0,
    GROUP1,
    REWARDS0,
    _credit,
    _plan,
    _rollout,
    _spec,
    _two_groups,
)


def test_overlong_penalty_is_dapo_eq13_by_hand():
    # L_max 40, L_cache 8: 0 up to 32 tokens, then -(len - 32) / 8, -1 at 40.
    pen = dynamic.overlong_penalty(lengths=np.array([0, 10, 32, 33, 36, 39, 40]),
                                   max_new_tokens=40, buffer=8, penalty=1.0)
    np.testing.assert_allclose(pen, [0, 0, 0, -0.125, -0.5, -0.875, -1.0])
    assert pen.dtype == np.float32
    half = dynamic.overlong_penalty(lengths=np.array([36, 40]), max_new_tokens=40, buffer=8,
                                    penalty=0.5)
    np.testing.assert_allclose(half, [-0.25, -0.5])


def _round(reward, lengths, valid=None, rows=None):
    n = len(lengths)
    rows = np.arange(n) if rows is None else np.asarray(rows)
    return dynamic.Sampled([], None, None, rows, np.asarray(reward, np.float32), None, None, [],
                         np.asarray(lengths), {}, n, valid)


def test_soft_overlong_adds_the_penalty_to_r_and_logs_its_mean():
    cfg = config.load("configs/gspo.py:smoke", [("reward.overlong", "soft"),
                                                ("reward.overlong_buffer", "8")])
    assert cfg.rollout.max_new_tokens == 40
    got = _round([1, -1, 1, -1], [10, 36, 40, 38])
    stats = {}
    r = dynamic.shaped_reward(cfg, got, stats)
    np.testing.assert_allclose(r, [1, -1.5, 0, -1.75])
    assert stats["overlong_penalty_mean"] == pytest.approx(-(0.5 + 1 + 0.75) / 4)
    # This process's rows only (rows 1 and 2), and the mean over the trained (valid) rows.
    got = _round([-1, 1], [10, 36, 40, 38], valid=np.array([1, 1, 0, 0], bool), rows=[1, 2])
    stats = {}
    np.testing.assert_allclose(dynamic.shaped_reward(cfg, got, stats), [-1.5, 0])
    assert stats["overlong_penalty_mean"] == pytest.approx(-0.25)
    # The default leaves R as it is, logs nothing.
    plain = config.load("configs/gspo.py:smoke", [])
    stats = {}
    assert dynamic.shaped_reward(plain, got, stats) is got.reward and stats == {}


def test_overlong_config_checks():
    with pytest.raises(ConfigError, match="reward.overlong_buffer"):
        config.load("configs/gspo.py:smoke", [("reward.overlong", "soft")])
    with pytest.raises(ConfigError, match="reward.overlong"):
        config.load("configs/gspo.py:smoke", [("reward.overlong", "hard")])
    with pytest.raises(ConfigError, match="rollout.max_sampling_rounds"):
        config.load("configs/gspo.py:smoke", [("rollout.max_sampling_rounds", "0")])
    with pytest.raises(ConfigError, match="rollout.dynamic_sampling"):
        config.load("configs/score_grpo.py:smoke", [("rollout.dynamic_sampling", "True")])


def test_mixed_groups_read_the_raw_outcome():
    r = np.array([1, 1, 1, -1, -1, -1, -1, -1, 0.5, 0.5, 0.5, 0.5], np.float32)
    np.testing.assert_array_equal(dynamic.mixed_groups(reward=r, g=4), [True, False, False])


def test_choose_groups_takes_the_first_b_mixed_then_fillers():
    # Round 0 has 1 mixed group (index 2), round 1 has 2 (0, 3): B = 3 is filled exactly.
    mixed = [np.array([0, 0, 1, 0], bool), np.array([1, 0, 0, 1], bool)]
    picks, n = dynamic.choose_groups(mixed=mixed, b=3)
    assert n == 3 and picks.tolist() == [[0, 2], [1, 0], [1, 3]]
    # B = 2: round 1's surplus (group 3) is dropped.
    picks, n = dynamic.choose_groups(mixed=mixed, b=2)
    assert n == 2 and picks.tolist() == [[0, 2], [1, 0]]
    # Short: 3 mixed of B = 4 -> one filler, the first filtered group (round 0, group 0).
    picks, n = dynamic.choose_groups(mixed=mixed, b=4)
    assert n == 3 and picks.tolist() == [[0, 2], [1, 0], [1, 3], [0, 0]]


def test_round_keys_are_the_step_key_then_distinct():
    key = jax.random.key(7)
    assert dynamic.round_key(key, 0) is key
    data = lambda k: np.asarray(jax.random.key_data(k)).tolist()
    keys = [data(dynamic.round_key(key, r)) for r in range(1, 4)]
    taken = [data(key), data(jax.random.fold_in(key, 1)), data(jax.random.fold_in(key, 2))]
    assert len({str(k) for k in keys + taken}) == 6
    assert keys[0] == data(dynamic.round_key(key, 1))  # a pure function of (key, r)


@pytest.mark.parametrize("algo,credit", [("ibpo_gspo", "sequence"), ("ibpo_gspo", "token"),
                                         ("ibpo_grpo", "sequence")])
def test_all_wrong_group_has_no_phantom_advantage(algo, credit):
    """φ and the shaping are exactly 0 in a group without a correct response (its responses
    differ), so the std-normalized advantages there are exactly 0 on the real credit path; a
    non-zero shaping there would be blown up to full size by the std division."""
    _, spec = _spec(algo, **{"ibpo.credit": credit})
    assert spec.advantage.normalize_std and spec.ibpo.lam > 0
    cred, _ = _credit(spec, _two_groups())
    np.testing.assert_array_equal(np.asarray(cred.phi)[1], 0.0)
    np.testing.assert_array_equal(np.asarray(cred.shaped)[1], -1.0)
    np.testing.assert_array_equal(np.asarray(cred.adv)[4:], 0.0)
    assert np.abs(np.asarray(cred.adv)[:4]).max() > 0.5  # the mixed group has its signal
    # What the filter guards against: shaping noise λφ = 0.01 on one all-wrong response,
    # r̃ = [-0.99, -1, -1, -1]: deviations [0.0075, -0.0025 x 3], population variance
    # (0.0075² + 3 · 0.0025²) / 4 = 1.875e-5 -> A_0 = 0.0075 / (0.00433 + 1e-6) = √3.
    noisy = advantages.group_advantages(jnp.full((4,), -1.0), jnp.array([0.02, 0, 0, 0]),
                                        lam=0.5)
    assert float(noisy[0]) == pytest.approx(0.0075 / (np.sqrt(1.875e-5) + 1e-6), rel=1e-3)
    assert float(noisy[0]) > 1.7  # full size, from shaping noise alone



def _with_filler(filler_rewards):
    """GROUP0 (mixed, trained) then GROUP1's responses as dynamic sampling's filler group:
    invalid rows, one of them truncated."""
    rollout = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *filler_rewards])
    return rollout._replace(valid=jnp.arange(8) < 4, ended=rollout.ended.at[5].set(False))


def test_batch_metrics_leave_the_filler_group_out():
    """The step's batch metrics are group 0's alone, worked by hand; with the filler (an
    all-correct group, lengths 4, 2, 6, 4, one truncated) averaged in they would read
    reward_mean 0.5, accuracy 0.75, frac_groups_all_same 0.5, response_len_mean 4.875,
    frac_truncated 0.125, cov_y_phi -1/12, adv_var_gspo 0.5."""
    _, spec = _spec("ibpo_gspo")
    lam = spec.ibpo.lam
    cred, m = _credit(spec, _with_filler([1.0] * 4))
    # Group 0: R = [1, -1, -1, 1], φ = [0, 2/3, 0, 0], lengths (EOS included) 6, 6, 4, 7.
    y, phi = np.array(REWARDS0), np.array([0, 2 / 3, 0, 0])
    want = {"reward_mean": 0.0, "reward_var": 1.0, "accuracy": 0.5, "frac_groups_all_same": 0.0,
            "response_len_mean": 23 / 4, "frac_truncated": 0.0, "phi_mean": 1 / 3,
            # Cov(Y, φ) = mean(Y · (φ - 1/6)) = (-1/6 - 1/2 + 1/6 - 1/6) / 4 = -1/6;
            # V_φ = 1/9 - 1/36 = 1/12, so λ_max = 2 · (1/6) / (1/12) = 4.
            "cov_y_phi": -1 / 6, "lambda_max": 4.0, "adv_var_gspo": 1.0,
            "adv_var": float(np.var(y + lam * phi))}
    for k, v in want.items():
        assert float(m[k]) == pytest.approx(v, rel=1e-5, abs=1e-6), k
    # The same as the batch of group 0 alone, where no row is invalid.
    _, alone = _credit(spec, _rollout(list(GROUP0), list(REWARDS0)))
    for k in want:
        assert float(m[k]) == pytest.approx(float(alone[k]), rel=1e-5, abs=1e-6), k
    np.testing.assert_array_equal(np.asarray(cred.adv)[4:], 0.0)


def test_step_records_leave_the_filler_group_out():
    """first_error_agreement and Appendix A's line count group 0's rows only: a filler whose
    (invalid) wrong rows disagree with the checker does not change them."""
    _, spec = _spec("ibpo_gspo")
    rollout = _with_filler([1.0, -1.0, -1.0, -1.0])  # correct-mixed, so φ would score it
    cred, _ = _credit(spec, rollout)
    # φ's first errors of group 0's wrong rows are 2 and 0: the checker agrees on both; on
    # the filler's wrong rows it reports a step φ cannot find (99).
    infos = [{"first_wrong_step": t} for t in (None, 2, 0, None, None, 99, 99, 99)]
    got = step_records.first_error_agreement(cred, rollout, np.arange(8), infos, 4)
    assert got == {"first_error_agreement": 1.0}  # 2 of 5 with the filler's rows
    line = step_records.appendix_a(3, cred, rollout, np.arange(8), infos)
    assert line["reward"] == list(REWARDS0) and line["correct"] == [1, 0, 0, 1]
    assert line["first_error"][1:3] == [2, 0] and line["true_first_wrong"] == [-1, 2, 0, -1]
    np.testing.assert_allclose(line["phi"], [0, 0.66667, 0, 0])
    # Every row valid: the whole batch, as before.
    plain = step_records.appendix_a(3, cred, rollout._replace(valid=None), np.arange(8), infos)
    assert len(plain["reward"]) == 8 and plain["true_first_wrong"][5:] == [99] * 3

@functools.cache
def _update_fn(cfg, spec):
    optimizer = make_optimizer(cfg.optim, total_updates=10)
    return optimizer, jax.jit(functools.partial(step.update, spec, optimizer))


def _update(cfg, spec, rollout, cred, params):
    optimizer, fn = _update_fn(cfg, spec)  # one compile for the test's updates
    plan = packing.place(_plan(spec, rollout), jnp.asarray)
    state, _ = fn(init_state(params, optimizer), params, rollout, cred, jax.random.key(1), plan)
    return jax.tree.leaves(state.params)


def test_overlong_filter_takes_truncated_rows_out_of_the_loss():
    """Row 1 (wrong, in the mixed group) is truncated: with the filter its tokens carry no
    loss, so the update is the same whatever they are; its advantage was computed with it in
    the group's statistics. Without the filter the update changes with them."""
    cfg, spec = _spec("ibpo_gspo", **{"reward.overlong": "filter", "optim.layout": "rows"})
    rollout = _two_groups()
    rollout = rollout._replace(ended=rollout.ended.at[1].set(False))
    cred, _ = _credit(spec, rollout)
    assert float(cred.adv[1]) != 0.0  # in the group statistics, as DAPO's filter
    params = models.init(ARCH, jax.random.key(0)).params
    other = rollout._replace(response=rollout.response.at[1, :3].set(13))
    kept = dynamic.update_rows(cfg, rollout)
    np.testing.assert_array_equal(kept.valid, [True, False] + [True] * 6)
    a = _update(cfg, spec, kept, cred, params)
    b = _update(cfg, spec, dynamic.update_rows(cfg, other), cred, params)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    plain = config.load("configs/ibpo_gspo.py:smoke", [])
    assert dynamic.update_rows(plain, rollout) is rollout
    c = _update(cfg, spec, other._replace(valid=jnp.ones(8, bool)), cred, params)
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))
    # Invalid rows (dynamic sampling's fillers) stay invalid.
    both = dynamic.update_rows(cfg, rollout._replace(valid=jnp.arange(8) < 4))
    np.testing.assert_array_equal(both.valid, [True, False, True, True] + [False] * 4)


class _Trainer:
    """What `dynamic.assemble` reads of the trainer: the config, the mesh and the scorer
    (which records the rows it is asked to score again)."""

    def __init__(self, g, mesh=None):
        self.cfg = config.load("configs/gspo.py:smoke", [("rollout.group_size", str(g))])
        self.mesh, self.scored = mesh, []

    def score(self, records, tokens, lengths):
        self.scored.append([r["id"] for r in records])
        infos = [{"again": r["id"], "len": int(n)} for r, n in zip(records, lengths)]
        return None, None, None, infos


def _sampled(r, b, g, width, mesh):
    """Round r of b prompts x g samples with recognisable values: token (r, row) = 100r + row."""
    n = b * g
    put = lambda x: jax.device_put(x, jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(("data", "fsdp"), *([None] * (x.ndim - 1)))))
    tokens = np.repeat((100 * r + np.arange(n, dtype=np.int32))[:, None], width, 1)
    out = dynamic.sampling.SampleOutput(put(tokens), put(np.arange(n, dtype=np.int32) + 10 * r),
                                        put(tokens.astype(np.float32) / 1000))
    prompts = dynamic.PromptBatch(np.full((b, 3), r, np.int32), np.full(b, r + 1, np.int32), r)
    records = [{"id": (r, j)} for j in range(b)]
    reward = np.where(np.arange(n) % 2 == 0, 1.0, -1.0).astype(np.float32) * (r + 1)
    return dynamic.Sampled(records, prompts, out, np.arange(n), reward, reward > 0,
                         np.arange(n) % 3 == 0, [{"row": (r, i)} for i in range(n)],
                         np.arange(n) + 10 * r, {"time_rollout_s": 1.0 + r, "time_reward_s": 0.5},
                         n)


def test_assemble_takes_the_picked_groups_rows_and_marks_the_fillers():
    from ibpo_jax.runtime import sharding

    mesh = sharding.make_mesh(data=1, devices=jax.devices()[:1])
    b, g = 2, 2
    trainer = _Trainer(g, mesh)
    rounds = [_sampled(r, b, g, 3, mesh) for r in range(2)]
    picks = np.array([[1, 1], [0, 0]])  # round 1's group 1 (mixed), round 0's group 0 (filler)
    got = dynamic.assemble(trainer, rounds, picks, 1)
    want_rows = [(1, 2), (1, 3), (0, 0), (0, 1)]  # (round, row)
    np.testing.assert_array_equal(np.asarray(got.out.tokens)[:, 0],
                                  [100 * r + i for r, i in want_rows])
    np.testing.assert_array_equal(np.asarray(got.out.lengths), [12, 13, 0, 1])
    np.testing.assert_array_equal(got.lengths, [12, 13, 0, 1])
    np.testing.assert_allclose(np.asarray(got.out.logprobs)[:, 0], [0.102, 0.103, 0, 0.001])
    np.testing.assert_array_equal(got.reward, [2, -2, 1, -1])
    np.testing.assert_array_equal(got.correct, [True, False, True, False])
    np.testing.assert_array_equal(got.ended, [False, True, True, False])
    assert got.infos == [{"row": x} for x in want_rows] and trainer.scored == []
    assert got.records == [{"id": (1, 1)}, {"id": (0, 0)}]
    np.testing.assert_array_equal(got.prompts.tokens[:, 0], [1, 0])
    np.testing.assert_array_equal(got.prompts.lengths, [2, 1])
    assert got.prompts.truncated == 1  # every round's truncated prompts
    np.testing.assert_array_equal(got.valid, [True, True, False, False])
    assert got.sampled == 8 and got.times == {"time_rollout_s": 3.0, "time_reward_s": 1.0}
    np.testing.assert_array_equal(got.rows, np.arange(4))


def test_reports_score_again_only_the_rows_scored_elsewhere():
    # Round 0's rows 0-1 were this process's, rows 2-3 another's; the assembled batch puts
    # round 0's rows 3 and 1 on this process's rows 0 and 1: row 3's report is scored again.
    g = 2
    trainer = _Trainer(g)
    r0 = dynamic.Sampled([], None, None, np.array([0, 1]), None, None, None,
                       [{"row": 0}, {"row": 1}], None, {}, 4)
    records = [{"id": "a"}, {"id": "b"}]
    tokens, lengths = np.zeros((2, 3), np.int32), np.array([5, 6, 7, 8])
    infos = dynamic._reports(trainer, [r0], np.array([0, 0]), np.array([3, 1]), records,
                             np.array([0, 1]), tokens, lengths)
    assert infos == [{"again": "a", "len": 5}, {"row": 1}]
    assert trainer.scored == [["a"]]
