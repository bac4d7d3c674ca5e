"""The loss knobs of issue 45 in the step and the trainer: where β·KL goes (`loss.kl_in`), that
β = 0 runs no reference pass, the KL reward's value, and one `smoke` run with k1 in the reward,
token TIS and an entropy bonus on one device, on the (2, 2, 2) mesh and killed / resumed."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax import models
from ibpo_jax.trainer import evaluation, packing, step
from ibpo_jax.trainer.state import init_state, make_optimizer
from tests.trainer.knob_harness import EXACT, run_match_mesh_resume
from tests.trainer.test_step import ARCH, GROUP0, GROUP1, P, _credit, _plan, _spec, _two_groups


def _model_passes(monkeypatch, spec, cfg, rollout) -> int:
    """How many frozen-parameter passes (π_ref's, π_old's) tracing the update makes."""
    calls = []
    real = step._frozen_stats
    monkeypatch.setattr(step, "_frozen_stats",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    optimizer = make_optimizer(cfg.optim, total_updates=10)
    params = models.init(ARCH, jax.random.key(0)).params
    cred, _ = _credit(spec, rollout)
    plan = packing.place(_plan(spec, rollout), jnp.asarray)
    jax.make_jaxpr(functools.partial(step.update, spec, optimizer))(
        init_state(params, optimizer), params, rollout, cred, jax.random.key(1), plan)
    return len(calls)


def test_beta_zero_skips_the_reference_pass_in_both_modes(monkeypatch):
    rollout = _two_groups()
    passes = {}
    for beta in (0.0, 0.1):
        for kl_in in ("loss", "reward"):
            cfg, spec = _spec("ibpo_gspo", **{"loss.beta": beta, "loss.kl_in": kl_in})
            passes[beta, kl_in] = _model_passes(monkeypatch, spec, cfg, rollout)
            # The trainer builds the KL reward's π_ref pass (`step.reward_kl`) only for these.
            assert spec.kl_in_reward == (beta > 0 and kl_in == "reward")
    assert passes[0.1, "loss"] == passes[0.0, "loss"] + 1  # π_ref's pass, in the loss only
    assert passes[0.0, "reward"] == passes[0.1, "reward"] == passes[0.0, "loss"]


def test_reward_kl_is_beta_times_the_rows_summed_estimate():
    _, spec = _spec("ibpo_gspo", **{"loss.beta": 0.2, "loss.kl_estimator": "k1",
                                    "loss.kl_in": "reward", "optim.layout": "packed"})
    rows = GROUP0 + GROUP1
    rng = np.random.default_rng(0)
    rollout = _two_groups()
    rollout = rollout._replace(sample_logp=jnp.asarray(-rng.uniform(0.1, 3.0, (8, 8)),
                                                       jnp.float32))
    ref = models.init(ARCH, jax.random.key(7)).params
    got = jax.jit(functools.partial(step.reward_kl, spec))(ref, rollout)
    options = models.make_options(jnp.float32)
    for i, toks in enumerate(rows):
        toks = [*toks, 2]  # EOS
        prompt = list(np.asarray(rollout.prompt[i, P - int(rollout.prompt_len[i]):]))
        lp = models.token_logprobs(ARCH, options, ref, jnp.asarray([prompt + toks]),
                                   temperature=spec.temperature).logprobs[0, len(prompt):]
        want = 0.2 * np.sum(np.asarray(rollout.sample_logp[i, :len(toks)]) - np.asarray(lp))
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-6)


def test_credit_takes_the_kl_penalty_off_the_reward_it_trains_on():
    _, spec = _spec("ibpo_gspo")
    rollout = _two_groups()
    pen = jnp.array([0.1, 0.3, -0.2, 0.0, 0.05, 0.2, 0.0, 0.1])
    cred, m = _credit(spec, rollout._replace(kl_penalty=pen))
    shifted, _ = _credit(spec, rollout._replace(reward=rollout.reward - pen))
    np.testing.assert_allclose(cred.adv, shifted.adv, rtol=1e-6)
    np.testing.assert_allclose(cred.shaped, shifted.shaped, rtol=1e-6)
    plain, m_plain = _credit(spec, rollout)
    np.testing.assert_array_equal(cred.phi, plain.phi)  # φ reads correctness, not the reward
    assert m["reward_mean"] == m_plain["reward_mean"]  # the logged reward is R itself
    np.testing.assert_allclose(m["kl_reward"], float(jnp.mean(pen)), rtol=1e-6)
    assert float(jnp.abs(cred.adv[4:]).max()) > 0.1  # the all-wrong group: the KL's signal


def test_eval_entropy_is_the_token_mean_over_the_evaluated_responses():
    # Chunks of 2 prompts x 2 samples, each response 2 tokens; the sampler's per-row entropy
    # sums: 0.4 (q even) or 1.0 (q odd) per token. Problems 0..4: 3 even, 2 odd; the padded
    # last chunk's copy is not counted: (3 · 0.4 + 2 · 1.0) / 5 per token.
    from tests.trainer import test_evaluation as te

    def generate(params, tokens, lengths, key):
        out = te.generate(params, tokens, lengths, key)
        odd = [int(te.TOK.decode([t for t in p.tolist() if t not in (te.TOK.pad_id,
                                                                     te.TOK.bos_id)])[1:]) % 2
               for p in tokens]
        out.entropy = np.repeat([2 * (1.0 if o else 0.4) for o in odd], 2).astype(np.float32)
        return out

    out = evaluation.evaluate(generate, None, records=te.RECORDS, task=te.Task(),
                              tokenizer=te.TOK, pool=te.Pool(), samples=2, chunk=2,
                              max_prompt_len=8)
    assert out["eval_entropy"] == pytest.approx((3 * 0.4 + 2 * 1.0) / 5)


# ---------------------------------------------------------------------- end to end, smoke

# At step 1 π = π_ref, so the rows' KL rewards are rounding noise (the sampler's log-probs
# against the reference's pass), and std-normalized advantages would blow that noise up to
# full size in all-same groups, differently on the mesh: centered advantages keep it ~1e-8.
KNOBS = {"loss.beta": 0.05, "loss.kl_estimator": "k1", "loss.kl_in": "reward",
         "loss.tis": "token", "loss.entropy_coef": 0.01, "advantage.normalize_std": False}


@pytest.mark.usefixtures("one_device")
def test_loss_knobs_run_match_the_mesh_and_resume_bitwise(smoke_data_dir, tmp_path):
    ref = run_match_mesh_resume(smoke_data_dir, tmp_path, KNOBS, exact=EXACT + ("reward_mean",))
    for r in ref[1:]:
        assert r["kl_reward"] != 0 and "kl" not in r  # β·KL in the reward, not in the loss
        # One device in fp32: sampler and trainer agree to rounding (k3 of ~1e-7 gaps).
        assert abs(r["mismatch_kl"]) < 1e-6 and 0 <= r["tis_capped_frac"] <= 1
        assert r["entropy_loss"] < 0  # -coef · entropy
    assert all(r["eval_entropy"] > 0 for r in ref if "eval_accuracy" in r)
