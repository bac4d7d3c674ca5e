"""The jitted credit and update functions on hand-built rollouts with a tiny random Qwen3."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import config, models
from ibpo_jax.core import advantages
from ibpo_jax.trainer import packing, step
from ibpo_jax.trainer.state import init_state, make_optimizer

NL = 3  # the delimiter token of these tests
VOCAB = 16
G = 4
P, R = 4, 8


def _tiny_model():
    arch = models.Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=16, rope_theta=10_000.0, tie_word_embeddings=True)
    return arch


ARCH = _tiny_model()


def _spec(algo="ibpo_gspo", value_head=False, **overrides):
    cfg = config.load(f"configs/{algo}.py:smoke", [(k, str(v)) for k, v in overrides.items()])
    options = models.make_options(jnp.float32, value_head=value_head)
    return cfg, step.StepSpec.from_config(cfg, ARCH, options)


def _rollout(responses, rewards, *, prompt=(5, 6, 7)):
    """responses: token lists (EOS = 2 appended to each); groups of G consecutive rows."""
    n = len(responses)
    resp = np.zeros((n, R), np.int32)
    lens = np.zeros(n, np.int32)
    for i, toks in enumerate(responses):
        toks = [*toks, 2]
        resp[i, : len(toks)] = toks
        resp[i, len(toks):] = 9  # garbage past the length must not matter
        lens[i] = len(toks)
    pr = np.zeros((n, P), np.int32)
    pr[:, P - len(prompt):] = prompt
    rewards = np.asarray(rewards, np.float32)
    return step.Rollout(
        prompt=jnp.asarray(pr), prompt_len=jnp.full(n, len(prompt), jnp.int32),
        response=jnp.asarray(resp), response_len=jnp.asarray(lens),
        sample_logp=jnp.zeros((n, R)), reward=jnp.asarray(rewards),
        correct=jnp.asarray(rewards > 0), ended=jnp.ones(n, bool))


IS_DELIM = jnp.zeros(VOCAB, bool).at[NL].set(True)
A, B, C, X, Y = 10, 11, 12, 13, 14
# Group 0: two correct "A\nB\nC" (one with a trailing newline: same steps, another length),
# one wrong that errs at its 3rd step, one that errs at once.
GROUP0 = ([A, NL, B, NL, C], [A, NL, B, NL, X], [X, NL, Y], [A, NL, B, NL, C, NL])
REWARDS0 = (1.0, -1.0, -1.0, 1.0)
# Group 1: all wrong (φ = 0, constant group -> A = 0).
GROUP1 = ([A, NL, X], [Y], [A, NL, B, NL, Y], [X, NL, X])
REWARDS1 = (-1.0, -1.0, -1.0, -1.0)


def _two_groups():
    """GROUP0's rows then GROUP1's, with their rewards (B = 2 groups of G = 4)."""
    return _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1])


def _credit(spec, rollout):
    return jax.jit(functools.partial(step.credit, spec))(rollout, IS_DELIM)


def test_credit_phi_and_advantages_by_hand():
    _, spec = _spec("ibpo_gspo")
    cred, m = _credit(spec, _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1]))
    # Row 1 keeps 2 of its 3 steps before the first error: φ = 2/3; row 2 errs at once: φ = 0.
    np.testing.assert_allclose(cred.phi[0], [0, 2 / 3, 0, 0], atol=1e-6)
    np.testing.assert_allclose(cred.phi[1], 0.0)
    np.testing.assert_array_equal(cred.first_error[0, 1:3], [2, 0])
    # r̃ = R + 0.5 φ = [1, -2/3, -1, 1]; mean 1/12; population std sqrt(mean(r̃²) - mean²).
    shaped = np.array([1, -1 + 0.5 * 2 / 3, -1, 1])
    std = np.sqrt(np.mean(shaped**2) - np.mean(shaped) ** 2)
    np.testing.assert_allclose(cred.adv[:4], (shaped - shaped.mean()) / (std + 1e-6), rtol=1e-5)
    np.testing.assert_array_equal(cred.adv[4:], 0.0)  # constant group: exactly 0
    assert m["frac_groups_all_same"] == pytest.approx(0.5)
    assert m["phi_mean"] == pytest.approx(1 / 3, rel=1e-5)  # wrong rows of group 0: (2/3 + 0)/2
    assert m["accuracy"] == pytest.approx(0.25)


def test_terminal_operator_is_plain_grpo():
    _, spec = _spec("grpo")
    cred, _ = _credit(spec, _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1]))
    np.testing.assert_array_equal(cred.phi, 0.0)
    np.testing.assert_allclose(cred.adv[:4], np.array(REWARDS0) / (1 + 1e-6), rtol=1e-6)


def test_token_credit_gives_delta_per_token():
    _, spec = _spec("ibpo_gspo", **{"ibpo.credit": "token"})
    assert spec.loss.name == "gspo_token"
    cred, _ = _credit(spec, _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1]))
    adv = np.asarray(cred.adv)
    assert adv.shape == (8, R)
    # Row 1: tokens of its first two steps (A \n B \n) get R + λ·1, its erring step R + λ·0.
    first, erring = adv[1, :4], adv[1, 4]
    assert np.allclose(first, first[0]) and first[0] > erring
    shaped = np.array([1, -1 + 0.5 * 2 / 3, -1, 1])
    std = np.sqrt(np.mean(shaped**2) - np.mean(shaped) ** 2)
    np.testing.assert_allclose(first[0], (-1 + 0.5 - shaped.mean()) / (std + 1e-6), rtol=1e-5)
    np.testing.assert_allclose(erring, (-1 - shaped.mean()) / (std + 1e-6), rtol=1e-5)


def _plan(spec, rollout):
    prompt_len, response_len = np.asarray(rollout.prompt_len), np.asarray(rollout.response_len)
    if spec.layout != "packed":
        return packing.identity(prompt_len, P, G)
    return packing.first_fit(prompt_len, response_len, P + R,
                             multiple=spec.optim.minibatches * spec.optim.microbatches)


def _update(cfg, spec, rollout, params=None):
    optimizer = make_optimizer(cfg.optim, total_updates=10)
    if params is None:
        params = models.init(ARCH, jax.random.key(0), value_head=spec.options.value_head).params
    state = init_state(params, optimizer)
    cred, _ = _credit(spec, rollout)
    fn = jax.jit(functools.partial(step.update, spec, optimizer))
    plan = packing.place(_plan(spec, rollout), jnp.asarray)
    return fn(state, params, rollout, cred, jax.random.key(1), plan)


# Short responses: two rollout rows fit in each packed row of P + R = 12 columns.
SHORT = ([A, NL, B], [A, NL, X], [X], [A, NL, B], [A], [Y], [A, NL], [X])
SHORT_REWARDS = (1.0, -1.0, -1.0, 1.0, -1.0, 1.0, -1.0, -1.0)


@pytest.mark.parametrize("algo", ["ibpo_gspo", "ibpo_grpo", "ppo"])
@pytest.mark.parametrize("microbatches", [1, 2])
@pytest.mark.parametrize("layout", ["packed", "grouped"])
def test_update_layouts_equal_rows(layout, algo, microbatches):
    """Packing rollout rows two by two into the model's rows (half the rows, less padding
    work), or encoding each prompt once for its group ("grouped"), gives the same update and
    metrics as one rollout row per model row."""
    rollout = _rollout(SHORT, SHORT_REWARDS)
    cfg, spec = _spec(algo, value_head=algo == "ppo")
    spec = dataclasses.replace(spec.with_optim(microbatches=microbatches), layout="rows")
    other = dataclasses.replace(spec, layout=layout)
    if layout == "packed":
        plan = _plan(other, rollout)
        assert plan.rows == 4 and np.bincount(plan.bin).tolist() == [2, 2, 2, 2]
    params = models.init(ARCH, jax.random.key(0), value_head=algo == "ppo").params
    unpacked, m1 = _update(cfg, spec, rollout, params)
    packed, m2 = _update(cfg, other, rollout, params)
    for a, b in zip(jax.tree.leaves(unpacked.params), jax.tree.leaves(packed.params)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
    # The residual at the current ratios needs whole groups per micro-batch: not "packed".
    per_update = {"cancellation_residual_updates"} if layout == "packed" else set()
    assert set(m1) == set(m2) | per_update
    for key in m2:
        assert float(m2[key]) == pytest.approx(float(m1[key]), rel=1e-4, abs=1e-6), key
    assert float(m1["grad_norm"]) > 0


def test_packed_minibatches_use_every_row_once_per_epoch():
    """Several minibatches of packed rows: the updates of an epoch together see every rollout
    row once. At lr 0 each update is on-policy, so the step's token-mean loss (a Stat summed
    over the updates) equals the one-update loss exactly when the minibatches partition the
    rows (a row seen twice or skipped would reweight the unequal advantages)."""
    rollout = _rollout(SHORT, SHORT_REWARDS)
    cfg, spec = _spec("ibpo_grpo", **{"loss.aggregation": "token_mean", "optim.lr": 0.0})
    spec = dataclasses.replace(spec, layout="packed")
    _, whole = _update(cfg, spec, rollout)
    _, split = _update(cfg, spec.with_optim(minibatches=2), rollout)
    assert abs(float(whole["pg_loss"])) > 1e-3
    assert float(split["pg_loss"]) == pytest.approx(float(whole["pg_loss"]), rel=1e-5)


@pytest.mark.parametrize("algo", ["ibpo_grpo", "ppo"])
def test_microbatch_accumulation_is_exact(algo):
    """Micro-batches (and, for PPO, the chunked π_old / value pass and chunked log-softmax)
    give the update of one batch."""
    rollout = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1])
    cfg, spec = _spec(algo, value_head=algo == "ppo")
    params = models.init(ARCH, jax.random.key(0), value_head=algo == "ppo").params
    whole, m1 = _update(cfg, spec, rollout, params)
    split_spec = dataclasses.replace(spec.with_optim(microbatches=2), logits_chunk=3)
    split, m2 = _update(cfg, split_spec, rollout, params)
    for a, b, c in zip(jax.tree.leaves(whole.params), jax.tree.leaves(split.params),
                       jax.tree.leaves(params)):
        assert not np.array_equal(a, c)  # the update moved every leaf
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
    assert float(m1["grad_norm"]) == pytest.approx(float(m2["grad_norm"]), rel=1e-5)
    assert float(m1["grad_norm"]) > 0  # on-policy (ratio 1) still carries gradient
    assert int(whole.step) == 1


def test_nonfinite_update_is_skipped():
    cfg, spec = _spec("ibpo_gspo")
    rollout = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1])
    params = models.init(ARCH, jax.random.key(0)).params
    # One overflowing weight (as after a bf16 blow-up) makes the loss and gradients non-finite.
    poisoned = {**params, "final_norm": params["final_norm"].at[0].set(jnp.inf)}
    state, m = _update(cfg, spec, rollout, poisoned)
    assert int(m["updates_skipped_nonfinite"]) == 1
    assert not np.isfinite(float(m["grad_norm"]))
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(poisoned)):
        np.testing.assert_array_equal(a, b)  # update skipped: params untouched
    assert int(state.step) == 1  # the step still counts; the run continues
    _, m = _update(cfg, spec, rollout, params)
    assert int(m["updates_skipped_nonfinite"]) == 0


def test_update_making_a_parameter_nonfinite_is_skipped():
    """Finite loss and gradients, but a step that overflows the parameters (lr 1e39 is inf in
    float32): the parameter guard keeps the old state and counts the update as skipped."""
    cfg, spec = _spec("ibpo_gspo", **{"optim.lr": 1e39})
    rollout = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1])
    params = models.init(ARCH, jax.random.key(0)).params
    state, m = _update(cfg, spec, rollout, params)
    assert int(m["updates_skipped_nonfinite"]) == 1
    assert np.isfinite(float(m["grad_norm"])) and float(m["grad_norm"]) > 0  # not the grad guard
    assert np.isfinite(float(m["pg_loss"]))  # nor the loss guard
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)
    counts = [x for x in jax.tree.leaves(state.opt_state) if getattr(x, "ndim", 1) == 0]
    assert all(int(c) == 0 for c in counts)  # the optimizer state is kept too


def test_cancellation_diagnostics_and_min_replace():
    # Responses share prefixes of several depths and have unequal lengths, so the 1/|y_i|
    # weights of seq_mean_token_mean break exchangeability (DESIGN §5 M1).
    cfg, spec = _spec("ibpo_grpo", **{"cancellation.transform": "min_replace"})
    rollout = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1])
    _, m = _update(cfg, spec, rollout)
    assert float(m["cancellation_residual"]) > 0.01
    assert float(m["cancellation_residual_transformed"]) < 1e-6
    buckets = [f"cancellation_residual_df{q}" for q in (25, 50, 75, 100)]  # context-free
    assert max(float(m[k]) for k in buckets) > 0.01
    cfg, spec = _spec("ibpo_grpo", **{"loss.aggregation": "token_mean"})
    _, m = _update(cfg, spec, rollout)
    assert float(m["cancellation_residual"]) < 1e-6  # token_mean on-policy: exchangeable
    assert max(float(m[k]) for k in buckets) < 1e-6


def test_ppo_update_trains_the_value_head():
    cfg, spec = _spec("ibpo_ppo", value_head=True)
    rollout = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1])
    params = models.init(ARCH, jax.random.key(0), value_head=True).params
    state, m = _update(cfg, spec, rollout, params)
    assert float(m["vf_loss"]) > 0
    moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(state.params),
                                                      jax.tree.leaves(params))]
    assert all(moved)


def test_learning_rate_schedule():
    from ibpo_jax.trainer.state import learning_rate

    cfg = config.load("configs/grpo.py:smoke", [("optim.lr", "1.0"), ("optim.warmup_steps", "4"),
                                                 ("optim.schedule", "cosine")])
    lr = learning_rate(cfg.optim, total_steps=12)
    # Warm-up: (count + 1) / 4, then cosine over the remaining 8 updates.
    np.testing.assert_allclose([float(lr(c)) for c in (0, 1, 3, 4, 8, 12)],
                               [0.25, 0.5, 1.0, 1.0, 0.5, 0.0], atol=1e-6)


def test_multi_update_path_matches_single_update_diagnostics():
    """Several updates per rollout take π_old from a separate pass up front; the on-policy
    diagnostics must equal those the single-update path computes inside its gradient pass."""
    rollout = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1])
    cfg, spec = _spec("ibpo_grpo")
    assert spec.single_update
    params = models.init(ARCH, jax.random.key(0)).params
    _, single = _update(cfg, spec, rollout, params)
    multi_spec = spec.with_optim(minibatches=2)
    assert not multi_spec.single_update
    state, multi = _update(cfg, multi_spec, rollout, params)
    for key in ("cancellation_residual", "cancellation_residual_whole", "entropy",
                "logprob_mismatch"):
        assert float(multi[key]) == pytest.approx(float(single[key]), rel=1e-5, abs=1e-7), key
    assert float(single["entropy"]) > 0
    # Two optimizer updates happened: Adam's count is 2.
    counts = [x for x in jax.tree.leaves(state.opt_state) if getattr(x, "ndim", 1) == 0]
    assert any(int(c) == 2 for c in counts)


def test_shared_prefix_drift_across_the_step():
    """cancellation.log_drift: mean Δ log π on shared nodes between π_old and the updated
    policy. No learning rate, no drift; a large one moves the shared prefixes."""
    rollout = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1])
    params = models.init(ARCH, jax.random.key(0)).params
    out = {}
    for lr in (0.0, 0.05):
        cfg, spec = _spec("ibpo_grpo", **{"optim.lr": lr, "cancellation.log_drift": True})
        # Several updates: π_old comes from the trainer's own pass up front.
        _, m = _update(cfg, spec.with_optim(minibatches=2), rollout, params)
        out[lr] = (float(m["shared_logprob_drift"]), float(m["shared_logprob_drift_whole"]))
    np.testing.assert_allclose(out[0.0], 0.0, atol=1e-6)
    assert abs(out[0.05][0]) > 1e-3
    assert out[0.05][1] == 0.0  # no node holds a whole group here (first tokens differ)
    # One update: π_old is the gradient pass's own log-probs (not the sampler's).
    cfg, spec = _spec("ibpo_grpo", **{"optim.lr": 0.0, "cancellation.log_drift": True})
    _, m = _update(cfg, spec, rollout._replace(sample_logp=rollout.sample_logp - 1.0), params)
    assert abs(float(m["shared_logprob_drift"])) < 1e-5


def test_logging_the_drift_does_not_change_the_update():
    """The reproduction grid shares one GRPO run between C.4 and the cancellation grid's
    default cell, trained with the drift logged: the update must be the plain one."""
    rollout = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1])
    params = models.init(ARCH, jax.random.key(0)).params
    states = []
    for drift in (False, True):
        cfg, spec = _spec("grpo", **{"optim.lr": 0.05, "cancellation.log_drift": drift})
        state, m = _update(cfg, spec.with_optim(minibatches=2), rollout, params)
        assert ("shared_logprob_drift" in m) == drift
        states.append(state)
    for a, b in zip(jax.tree.leaves(states[0].params), jax.tree.leaves(states[1].params)):
        np.testing.assert_array_equal(a, b)


def test_residual_at_the_current_ratios_is_of_the_weights_the_update_applies():
    """cancellation_residual_updates: min_replace gives every member of a shared node the same
    weight, so the residual of what the updates apply is 0 where the plain weights' is not
    (1/|y_i| differs between the members: M1)."""
    rollout = _rollout([*GROUP0, *GROUP1], [*REWARDS0, *REWARDS1])
    params = models.init(ARCH, jax.random.key(0)).params
    out = {}
    for transform in ("none", "min_replace"):
        cfg, spec = _spec("grpo", **{"optim.lr": 0.05, "cancellation.transform": transform,
                                     "loss.aggregation": "seq_mean_token_mean"})
        _, m = _update(cfg, spec.with_optim(minibatches=2), rollout, params)
        out[transform] = float(m["cancellation_residual_updates"])
    assert out["none"] > 1e-3
    assert out["min_replace"] < 1e-6


def test_invalid_rows_carry_no_advantage_and_no_tokens():
    """Rollout.valid (second-round slot layouts): an invalid row is outside its group's
    statistics, gets advantage 0, and the update equals one where it has no response."""
    cfg, spec = _spec("ibpo_gspo", **{"optim.layout": "rows"})
    full = _rollout(GROUP0 + GROUP1, REWARDS0 + REWARDS1)
    valid = jnp.array([True, True, False, True, True, True, True, True])
    masked = full._replace(valid=valid)
    cred, _ = _credit(spec, masked)
    assert float(cred.adv[2]) == 0.0
    kept = np.array([0, 1, 3])  # group 0 without row 2 (wrong; φ of the others unchanged)
    phi = np.asarray(cred.phi).reshape(-1)[kept]
    want = advantages.group_advantages(jnp.asarray(REWARDS0)[kept], jnp.asarray(phi),
                                       lam=spec.ibpo.lam)
    np.testing.assert_allclose(np.asarray(cred.adv)[kept], want, rtol=1e-6)
    empty = masked._replace(response_len=masked.response_len.at[2].set(0))
    (s1, _), (s2, _) = _update(cfg, spec, masked), _update(cfg, spec, empty)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
        np.testing.assert_array_equal(a, b)


def test_kl_anchor_on_every_row_is_the_loss_kl_term():
    """A per-row KL anchor of weight β on every row (SCoRe's stage I uses it on the first
    attempts) gives the same update as the loss's own β · KL."""
    rollout = _rollout(GROUP0 + GROUP1, REWARDS0 + REWARDS1)
    params = models.init(ARCH, jax.random.key(0)).params
    ref = models.init(ARCH, jax.random.key(7)).params  # far from the policy: a real KL
    out = []
    for beta, anchor in ((0.3, None), (0.0, jnp.full(8, 0.3)), (0.0, None)):
        cfg, spec = _spec("ibpo_gspo", **{"loss.beta": beta, "optim.layout": "rows"})
        optimizer = make_optimizer(cfg.optim, total_updates=10)
        cred, _ = _credit(spec, rollout)
        fn = jax.jit(functools.partial(step.update, spec, optimizer))
        plan = packing.place(_plan(spec, rollout), jnp.asarray)
        out.append(fn(init_state(params, optimizer), ref, rollout._replace(kl_anchor=anchor),
                      cred, jax.random.key(1), plan)[0])
    without_kl = [float(jnp.max(jnp.abs(a - b))) for a, b in
                  zip(jax.tree.leaves(out[0].params), jax.tree.leaves(out[2].params))]
    assert max(without_kl) > 1e-6  # the KL term does move the update
    for a, b in zip(jax.tree.leaves(out[0].params), jax.tree.leaves(out[1].params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
