"""Tests of ibpo_jax/core/losses.py: hand-worked values, closed-form gradients (numpy, written from
the papers' formulas), micro-batch exactness, KL / entropy by hand, degenerate inputs."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax.config import LossConfig
from ibpo_jax.config.registry import AGGREGATIONS, KL_ESTIMATORS, LOSSES, UnknownNameError
from ibpo_jax.core import losses

NAMES = ("grpo", "ppo", "gspo", "gspo_token")
AGGS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")
# The papers' clip ranges: ε = 0.2 for GRPO / PPO, GSPO's 3e-4 / 4e-4.
CLIP = {"grpo": (0.2, 0.2), "ppo": (0.2, 0.2), "gspo": (3e-4, 4e-4), "gspo_token": (3e-4, 4e-4)}
SPEC_FIELDS = {f.name for f in dataclasses.fields(LossConfig)}


def make_spec(name, **kw):
    """The LossSpec of loss `name`: its paper clip range, no KL unless asked, and `kw`."""
    lo, hi = CLIP[name]
    return LossConfig(**{"name": name, "clip_eps_low": lo, "clip_eps_high": hi,
                              "beta": 0.0, **kw})


def _split(name, kw):
    """(LossSpec from the hyperparameters in kw, the array arguments)."""
    hyper = {k: kw.pop(k) for k in list(kw) if k in SPEC_FIELDS}
    return make_spec(name, **hyper), kw


@functools.partial(jax.jit, static_argnames=("spec",))
def _loss_and_grad(logp, *, spec, **kw):
    def num(lp):
        out = LOSSES.get(spec.name)(spec, logp=lp, **kw)
        return out.num, out

    (_, out), grad = jax.value_and_grad(num, has_aux=True)(logp)
    return out, grad


def loss_and_grad(logp, *, name, **kw):
    """(LossOutput, ∂num/∂logp) of the named loss; kw mixes hyperparameters and arrays."""
    spec, arrays = _split(name, kw)
    return _loss_and_grad(logp, spec=spec, **arrays)


def weights(logp, *, name, **kw):
    spec, arrays = _split(name, kw)
    return jax.jit(losses.token_weights, static_argnames=("spec",))(spec, logp=logp, **arrays)


def _np_reference(name, logp, old, adv, mask, agg, lo, hi, norm_const=7.0):
    """(num, den, ∂num/∂logp) from the textbook formulas, in numpy."""
    m = mask.astype(bool)
    mf = m.astype(np.float64)
    n = mf.sum(1)
    if agg == "seq_mean_token_mean":
        c, den = mf / np.maximum(n, 1)[:, None], (n > 0).sum()
    elif agg == "token_mean":
        c, den = mf, mf.sum()
    else:
        c, den = mf / norm_const, (n > 0).sum()
    lr = np.where(m, logp.astype(np.float64) - old, 0.0)
    a_tok = np.broadcast_to(adv[:, None], m.shape) if adv.ndim == 1 else adv

    def surrogate(r, a):
        unclipped = ~(((a > 0) & (r > 1 + hi)) | ((a < 0) & (r < 1 - lo)))
        return -np.minimum(r * a, np.clip(r, 1 - lo, 1 + hi) * a), unclipped

    if name in ("grpo", "ppo"):
        rho = np.exp(lr)
        loss, unc = surrogate(rho, a_tok)
        grad = -a_tok * rho * unc * c  # ∂ℓ_it/∂logp_it = -A ρ 1[unclipped]
    else:
        s = np.exp(lr.sum(1) / np.maximum(n, 1))
        if name == "gspo":
            loss_i, unc = surrogate(s, adv)
            loss = np.broadcast_to(loss_i[:, None], m.shape)
            # ∂ℓ_i/∂logp_it = -A_i s_i 1[unclipped_i] / n_i, counted once per token coefficient.
            grad = -(c.sum(1) * adv * s * unc / np.maximum(n, 1))[:, None] * mf
        else:
            loss, unc = surrogate(np.broadcast_to(s[:, None], m.shape), a_tok)
            grad = -a_tok * s[:, None] * unc * c  # ∂s_it/∂logp_it = s_i
    return float((c * np.where(m, loss, 0.0)).sum()), float(den), grad


def _batch(seed, name):
    rng = np.random.default_rng(seed)
    b, t = 5, 7
    lengths = np.array([7, 4, 1, 0, 6])
    mask = np.arange(t)[None, :] < lengths[:, None]
    logp = rng.normal(-2.0, 0.5, size=(b, t)).astype(np.float32)
    if name.startswith("gspo"):  # per-row shifts inside and outside [1 - 3e-4, 1 + 4e-4]
        shift = np.array([1e-3, -2e-4, 1e-4, 0.0, -1e-3])[:, None]
        noise = rng.normal(0, 1e-4, size=(b, t))
    else:
        shift, noise = 0.0, rng.normal(0, 0.3, size=(b, t))
    old = (logp - shift - noise).astype(np.float32)
    adv_seq = np.array([1.0, -0.5, 2.0, 0.7, -1.2], np.float32)
    adv = adv_seq if name == "gspo" else rng.normal(size=(b, t)).astype(np.float32)
    return logp, old, adv, mask


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("name", NAMES)
def test_gradient_matches_closed_form_and_token_weights(name, agg):
    logp, old, adv, mask = _batch(0, name)
    lo, hi = CLIP[name]
    kw = dict(old_logp=old, adv=adv, mask=mask, aggregation=agg, norm_const=7.0)
    out, grad = loss_and_grad(jnp.array(logp), name=name, **kw)
    num, den, want = _np_reference(name, logp, old, adv, mask, agg, lo, hi)
    np.testing.assert_allclose(out.num, num, rtol=1e-5, atol=1e-6)
    assert out.den == den
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)
    # The batch has both clipped and unclipped units, so the indicator is exercised.
    clip = losses.finalize_metrics(out.metrics)["clip_frac"]
    assert 0.0 < clip < 1.0
    # DESIGN §5 weights: ∂num/∂logp_it = -A_it w_it.
    w = weights(jnp.array(logp), name=name, **kw)
    a_tok = np.broadcast_to(adv[:, None], mask.shape) if adv.ndim == 1 else adv
    np.testing.assert_allclose(grad, -np.where(mask, a_tok, 0) * np.asarray(w), rtol=1e-6,
                               atol=1e-8)


def test_grpo_clipping_by_hand():
    # ρ = [1.5, 1.5, 0.5, 0.5], A = [+1, -1, +1, -1], ε = 0.2, token_mean over 4 tokens:
    #   ℓ = -min(ρA, clip(ρ)A) = [-1.2 (clipped), 1.5, -0.5, 0.8 (clipped)]
    #   loss = (-1.2 + 1.5 - 0.5 + 0.8) / 4 = 0.15
    #   ∂num/∂logp = -A ρ 1[unclipped] = [0, 1.5, -0.5, 0]
    old = jnp.zeros((1, 4))
    logp = jnp.log(jnp.array([[1.5, 1.5, 0.5, 0.5]]))
    adv = jnp.array([[1.0, -1.0, 1.0, -1.0]])
    out, grad = loss_and_grad(logp, name="grpo", old_logp=old, adv=adv, mask=jnp.ones((1, 4)),
                              aggregation="token_mean", clip_eps_low=0.2, clip_eps_high=0.2)
    np.testing.assert_allclose(out.num / out.den, 0.15, rtol=1e-6)
    np.testing.assert_allclose(grad, [[0.0, 1.5, -0.5, 0.0]], rtol=1e-6)
    m = losses.finalize_metrics(out.metrics)
    np.testing.assert_allclose(m["clip_frac"], 0.5)
    np.testing.assert_allclose([m["ratio_min"], m["ratio_max"], m["ratio_mean"]], [0.5, 1.5, 1.0],
                               rtol=1e-6)
    # Clip-higher (ε_high = 0.6): ρ = 1.5 with A > 0 is no longer clipped.
    out, grad = loss_and_grad(logp, name="grpo", old_logp=old, adv=adv, mask=jnp.ones((1, 4)),
                              aggregation="token_mean", clip_eps_low=0.2, clip_eps_high=0.6)
    np.testing.assert_allclose(grad, [[-1.5, 1.5, -0.5, 0.0]], rtol=1e-6)


def test_gspo_by_hand():
    # Row 0: log ρ = [0.1, -0.1, 0.3], s = e^0.1 > 1 + 4e-4 and A = 1 -> clipped: ℓ = -1.0004,
    #   no gradient. Row 1 (2 valid tokens): log ρ = [2e-4, -2e-4], s = 1, A = -2 -> ℓ = 2,
    #   ∂ℓ/∂logp_1t = -A s / n = 1. seq_mean_token_mean: loss = (-1.0004 + 2) / 2.
    old = jnp.zeros((2, 3))
    logp = jnp.array([[0.1, -0.1, 0.3], [2e-4, -2e-4, 5.0]])
    mask = jnp.array([[1, 1, 1], [1, 1, 0]])
    out, grad = loss_and_grad(logp, name="gspo", old_logp=old, adv=jnp.array([1.0, -2.0]),
                              mask=mask, aggregation="seq_mean_token_mean")
    np.testing.assert_allclose(out.num / out.den, (-1.0004 + 2.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(grad, [[0, 0, 0], [1, 1, 0]], atol=1e-6)
    m = losses.finalize_metrics(out.metrics)
    np.testing.assert_allclose(m["clip_frac"], 0.5)  # over sequences
    np.testing.assert_allclose(m["ratio_max"], math.exp(0.1), rtol=1e-6)


@pytest.mark.parametrize("agg", AGGS)
def test_gspo_token_equals_gspo_for_sequence_advantages(agg):
    logp, old, adv, mask = _batch(1, "gspo")
    kw = dict(old_logp=old, mask=mask, aggregation=agg, norm_const=7.0)
    ref, g_ref = loss_and_grad(jnp.array(logp), name="gspo", adv=adv, **kw)
    adv_tok = np.broadcast_to(adv[:, None], mask.shape)
    for a in (adv, adv_tok):
        out, g = loss_and_grad(jnp.array(logp), name="gspo_token", adv=a, **kw)
        np.testing.assert_allclose(out.num, ref.num, rtol=1e-6)
        np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-8)
    assert np.abs(np.asarray(g_ref)).max() > 0


@pytest.mark.parametrize("name", NAMES)
def test_on_policy_ratio_one_still_has_gradient(name):
    _, _, adv, mask = _batch(2, name)
    logp = jnp.full(mask.shape, -1.3)
    out, grad = loss_and_grad(logp, name=name, old_logp=logp, adv=adv, mask=mask,
                              aggregation="seq_mean_token_mean")
    n = mask.sum(1, keepdims=True)
    a_tok = np.broadcast_to(adv[:, None], mask.shape) if adv.ndim == 1 else adv
    # ρ = 1, nothing clipped: ∂num/∂logp_it = -A_it / n_i (c = 1/n_i; GSPO: -A_i · 1 · 1/n_i).
    want = np.where(mask, -a_tok / np.maximum(n, 1), 0.0)
    np.testing.assert_allclose(grad, want, rtol=1e-6)
    assert np.abs(want).max() > 0
    assert losses.finalize_metrics(out.metrics)["clip_frac"] == 0


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("name", ["grpo", "gspo"])
def test_microbatch_accumulation_is_exact(name, agg):
    rng = np.random.default_rng(3)
    b, v = 6, 4
    logp, old, adv, mask = _batch(3, name)
    logp, old, mask = (np.concatenate([x, x[:1]]) for x in (logp, old, mask))  # B = 6
    adv = np.concatenate([adv, adv[:1]])
    ref = (logp + rng.normal(0, 0.2, size=logp.shape)).astype(np.float32)
    logits = rng.normal(size=(b, logp.shape[1], v)).astype(np.float32)
    kw = dict(name=name, aggregation=agg, norm_const=7.0, beta=0.05, kl_estimator="k3")
    full, g_full = loss_and_grad(jnp.array(logp), old_logp=old, adv=adv, mask=mask,
                                 ref_logp=ref, logits=logits, **kw)
    nums, dens, grads, metrics = [], [], [], None
    for sl in (slice(0, 2), slice(2, 4), slice(4, 6)):  # same shapes: one compilation
        out, g = loss_and_grad(jnp.array(logp[sl]), old_logp=old[sl], adv=adv[sl],
                               mask=mask[sl], ref_logp=ref[sl], logits=logits[sl], **kw)
        nums.append(out.num), dens.append(out.den), grads.append(g)
        metrics = out.metrics if metrics is None else losses.combine_metrics(metrics, out.metrics)
    np.testing.assert_allclose(sum(nums) / sum(dens), full.num / full.den, rtol=1e-6)
    np.testing.assert_allclose(np.concatenate(grads) / sum(dens), g_full / full.den, rtol=1e-6)
    got, want = losses.finalize_metrics(metrics), losses.finalize_metrics(full.metrics)
    assert set(got) == set(want) >= {"pg_loss", "kl_loss", "kl", "entropy", "clip_frac"}
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(want["pg_loss"] + want["kl_loss"], full.num / full.den, rtol=1e-6)


def test_losses_vmap_over_groups():
    # [n_groups, G, T] through vmap: per-group (num, den) sum to the flattened batch's.
    logp, old, adv, mask = _batch(4, "grpo")
    logp, old, adv, mask = (np.concatenate([x, x[::-1]]) for x in (logp, old, adv, mask))
    spec = make_spec("grpo")
    fn = jax.jit(jax.vmap(lambda lp, o, a, m: losses.grpo_loss(spec, logp=lp, old_logp=o, adv=a,
                                                               mask=m)[:2]))
    nums, dens = fn(*(jnp.array(x).reshape(2, 5, -1) for x in (logp, old, adv, mask)))
    flat, _ = loss_and_grad(jnp.array(logp), name="grpo", old_logp=old, adv=adv, mask=mask,
                            aggregation="seq_mean_token_mean")
    np.testing.assert_allclose(nums.sum(), flat.num, rtol=1e-6)
    np.testing.assert_allclose(dens.sum(), flat.den)


def test_kl_estimators_by_hand():
    # π_θ = 0.5, π_ref = 0.25: u = log(0.25/0.5) = -ln 2, k3 = 0.5 + ln 2 - 1, ∂k3/∂logp = 1 - 0.5.
    # π_θ = 0.25, π_ref = 0.5: u = ln 2, k3 = 2 - ln 2 - 1, ∂k3/∂logp = 1 - 2 = -1.
    # k2 = ½(logp - ref)² = ½ ln²2 for both, ∂k2/∂logp = logp - ref = ±ln 2.
    ln2 = math.log(2.0)
    logp = jnp.log(jnp.array([[0.5, 0.25]]))
    ref = jnp.log(jnp.array([[0.25, 0.5]]))
    k3 = KL_ESTIMATORS.get("k3")
    np.testing.assert_allclose(k3(logp, ref), [[ln2 - 0.5, 1 - ln2]], rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: k3(x, ref).sum())(logp), [[0.5, -1.0]],
                               rtol=1e-6)
    k2 = KL_ESTIMATORS.get("k2")
    np.testing.assert_allclose(k2(logp, ref), [[ln2**2 / 2] * 2], rtol=1e-6)
    # Through a loss: A = 0 leaves only β·KL; token_mean over 2 tokens, β = 0.1.
    for est, val, g in (("k3", 0.5, [0.5, -1.0]), ("k2", ln2**2, [ln2, -ln2])):
        out, grad = loss_and_grad(logp, name="grpo", old_logp=logp, adv=jnp.zeros(1),
                                  mask=jnp.ones((1, 2)), ref_logp=ref, beta=0.1,
                                  kl_estimator=est, aggregation="token_mean")
        np.testing.assert_allclose(out.num / out.den, 0.1 * val / 2, rtol=1e-6)
        np.testing.assert_allclose(grad, 0.1 * np.array([g]), rtol=1e-6)


def test_entropy_by_hand():
    # p = [1/4, 1/4, 1/2]: H = 2·(1/4)·ln 4 + (1/2)·ln 2 = 1.5 ln 2; uniform over 4 with one
    # masked-out (-inf) logit -> uniform over 3: H = ln 3; the third token is padding.
    logits = jnp.log(jnp.array([[[1.0, 1.0, 2.0, 0.0], [1.0, 1.0, 1.0, 0.0],
                                 [5.0, 1.0, 1.0, 1.0]]]))
    stat = losses.entropy_stat(logits, jnp.array([[1, 1, 0]]))
    np.testing.assert_allclose(stat.num, 1.5 * math.log(2) + math.log(3), rtol=1e-6)
    assert stat.den == 2


@pytest.mark.parametrize("name", NAMES)
def test_garbage_padding_and_empty_rows(name):
    logp, old, adv, mask = _batch(5, name)
    ref = logp + 0.1
    kw = dict(name=name, aggregation="seq_mean_token_mean", beta=0.1, kl_estimator="k2")
    clean, g_clean = loss_and_grad(jnp.array(logp), old_logp=old, adv=adv, mask=mask,
                                   ref_logp=ref, **kw)
    bad = lambda x, v: np.where(mask, x, v).astype(np.float32)  # noqa: E731
    a_bad = adv if adv.ndim == 1 else bad(adv, np.nan)
    dirty, g_dirty = loss_and_grad(jnp.array(bad(logp, -np.inf)), old_logp=bad(old, np.nan),
                                   adv=a_bad, mask=mask, ref_logp=bad(ref, np.inf), **kw)
    np.testing.assert_allclose(dirty.num, clean.num, rtol=1e-6)
    np.testing.assert_allclose(g_dirty, g_clean, rtol=1e-6)
    assert clean.den == 4  # the empty row is not counted
    # A batch with no valid token at all: 0 / 0 -> loss 0, zero gradient, finite metrics.
    empty = np.zeros_like(mask)
    out, g = loss_and_grad(jnp.array(logp), old_logp=old, adv=adv, mask=empty, ref_logp=ref, **kw)
    assert out.num == 0 and out.den == 0 and losses.safe_div(out.num, out.den) == 0
    assert not np.any(g)
    assert not any(np.isnan(v) for v in losses.finalize_metrics(out.metrics).values())


def test_value_loss_by_hand():
    # ε_v = 0.2, V_old = 0 everywhere:
    #   V=0.5,  R=1:   v_clip=0.2,  err 0.25 < err_clip 0.64 -> ½·0.64 = 0.32, grad 0
    #   V=0.1,  R=1:   v_clip=0.1,  equal                     -> ½·0.81 = 0.405, grad V-R = -0.9
    #   V=-0.5, R=-1:  v_clip=-0.2, 0.25 < 0.64               -> 0.32, grad 0
    #   V=0.5,  R=0.3: v_clip=0.2,  err 0.04 > err_clip 0.01  -> ½·0.04 = 0.02, grad 0.2
    values = jnp.array([[0.5, 0.1, -0.5, 0.5]])
    returns = jnp.array([[1.0, 1.0, -1.0, 0.3]])

    def f(v):
        spec = make_spec("ppo", value_clip=0.2, aggregation="token_mean")
        out = losses.value_loss(spec, values=v, old_values=jnp.zeros((1, 4)), returns=returns,
                                mask=jnp.ones((1, 4)))
        return out.num, out

    (num, out), g = jax.value_and_grad(f, has_aux=True)(values)
    np.testing.assert_allclose(num / out.den, (0.32 + 0.405 + 0.32 + 0.02) / 4, rtol=1e-6)
    np.testing.assert_allclose(g, [[0.0, -0.9, 0.0, 0.2]], atol=1e-6)
    np.testing.assert_allclose(losses.finalize_metrics(out.metrics)["vf_clip_frac"], 0.5)


def test_registry_and_bad_inputs():
    assert set(LOSSES.names()) == set(NAMES)
    assert set(AGGREGATIONS.names()) == set(AGGS)
    assert set(KL_ESTIMATORS.names()) == {"k1", "k2", "k3", "low_var"}
    x = jnp.zeros((2, 3))
    m = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="gspo_token"):
        losses.gspo_loss(make_spec("gspo"), logp=x, old_logp=x, adv=x, mask=m)
    grpo = make_spec("grpo")
    with pytest.raises(ValueError, match=r"needs adv \[B, T\]"):
        losses.ppo_loss(make_spec("ppo"), logp=x, old_logp=x, adv=jnp.zeros(2), mask=m)
    with pytest.raises(ValueError, match="old_logp"):
        losses.grpo_loss(grpo, logp=x, old_logp=jnp.zeros((2, 4)), adv=jnp.zeros(2), mask=m)
    with pytest.raises(ValueError, match="ref_logp"):
        losses.grpo_loss(make_spec("grpo", beta=0.01), logp=x, old_logp=x, adv=jnp.zeros(2),
                         mask=m)
    with pytest.raises(ValueError, match="norm_const"):
        losses.grpo_loss(make_spec("grpo", aggregation="seq_mean_token_sum_norm"), logp=x,
                         old_logp=x, adv=jnp.zeros(2), mask=m)
    with pytest.raises(UnknownNameError, match="token_mean"):
        make_spec("grpo", aggregation="tokenmean")
    with pytest.raises(UnknownNameError, match="k3"):
        make_spec("grpo", kl_estimator="k4")
    # Each registered loss is the plain function a reader finds in core/losses.py.
    assert LOSSES.get("gspo") is losses.gspo_loss and LOSSES.get("ppo") is losses.ppo_loss


# ----------------------------------------------------------- KL estimators: exact expectations
# A categorical π_θ = softmax(θ) over 5 tokens and a fixed π_ref, far enough apart that the
# forward and reverse KLs' gradients differ. Every expectation is the exact sum over the
# support (no sampling); the "true" gradients are autodiff of the exact KLs.
THETA = jnp.array([1.0, 0.2, -0.5, 0.3, -1.2])
REF = jax.nn.log_softmax(jnp.array([-0.4, 0.9, 0.1, -1.0, 0.5]))


def _kl_expectations(name, theta=THETA, ref=REF):
    """(E_π[k], E_π[∇k] (k in the loss), E_π[sg(k) ∇logπ] (k in the reward)) over the support."""
    k = KL_ESTIMATORS.get(name)
    pi = lambda t: jnp.exp(jax.nn.log_softmax(t))  # noqa: E731
    sg = jax.lax.stop_gradient
    value = jnp.sum(pi(theta) * k(jax.nn.log_softmax(theta), ref))
    in_loss = jax.grad(lambda t: jnp.sum(sg(pi(t)) * k(jax.nn.log_softmax(t), ref)))(theta)
    in_reward = jax.grad(lambda t: jnp.sum(
        sg(pi(t) * k(jax.nn.log_softmax(t), ref)) * jax.nn.log_softmax(t)))(theta)
    return value, in_loss, in_reward


def _exact_kls(theta=THETA, ref=REF):
    """(KL(π‖π_ref), ∇KL(π‖π_ref), ∇KL(π_ref‖π)) by autodiff of the exact sums."""
    rev = lambda t: jnp.sum(jnp.exp(jax.nn.log_softmax(t)) * (jax.nn.log_softmax(t) - ref))  # noqa
    fwd = lambda t: jnp.sum(jnp.exp(ref) * (ref - jax.nn.log_softmax(t)))  # noqa: E731
    return rev(theta), jax.grad(rev)(theta), jax.grad(fwd)(theta)


def test_kl_estimators_value_and_gradient_against_the_exact_kl():
    kl, grad_rev, grad_fwd = _exact_kls()
    assert float(kl) > 0.1 and np.abs(grad_rev - grad_fwd).max() > 0.05  # a case that can fail
    close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)
    v, in_loss, in_reward = _kl_expectations("k1")
    close(v, kl)  # unbiased value
    close(in_loss, np.zeros(5))  # in the loss: no gradient in expectation
    close(in_reward, grad_rev)  # in the reward: the reverse KL's gradient
    v, in_loss, _ = _kl_expectations("k2")
    assert abs(float(v) - float(kl)) > 1e-2  # a biased value
    close(in_loss, grad_rev)  # the reverse KL's gradient in the loss
    v, in_loss, in_reward = _kl_expectations("k3")
    close(v, kl)
    close(in_loss, grad_fwd)  # in the loss: the forward KL's gradient
    close(in_reward, grad_rev - grad_fwd)
    # low_var = k3 wherever k3 < 10 (all tokens here): the same value and gradients.
    for a, b in zip(_kl_expectations("low_var"), _kl_expectations("k3")):
        close(a, b)


def test_low_var_bounds_k3_at_ten():
    # π_ref puts e^12 times π's mass on token 0: k3 = e^u - u - 1 > 10 there, where low_var
    # is 10 and carries no gradient (k3's ∂/∂logπ there is 1 - e^u).
    logp, ref = jnp.array([[-13.0, -0.5]]), jnp.array([[-1.0, -0.2]])
    k3, lv = KL_ESTIMATORS.get("k3"), KL_ESTIMATORS.get("low_var")
    u = np.array([12.0, 0.3])
    np.testing.assert_allclose(k3(logp, ref), [np.exp(u) - u - 1], rtol=1e-5)
    np.testing.assert_allclose(lv(logp, ref), [[10.0, np.exp(0.3) - 1.3]], rtol=1e-5)
    np.testing.assert_allclose(jax.grad(lambda x: lv(x, ref).sum())(logp),
                               [[0.0, 1 - np.exp(0.3)]], rtol=1e-5)
    np.testing.assert_allclose(KL_ESTIMATORS.get("k1")(logp, ref), [[-12.0, -0.3]], rtol=1e-6)


def test_kl_in_reward_leaves_the_loss_and_sums_per_row():
    # β·KL in the reward: no KL term in the loss (and no π_ref needed there); the row penalty
    # is β Σ_t k1 = 0.5 · ((-1 - -2) + (-1 - -0.5)) = 0.25 on row 0, 0.5 · (-3 - -1) on row 1
    # (its second token is padding).
    spec = make_spec("grpo", beta=0.5, kl_estimator="k1", kl_in="reward")
    logp = jnp.array([[-1.0, -1.0], [-3.0, -7.0]])
    ref = jnp.array([[-2.0, -0.5], [-1.0, 9.0]])
    mask = jnp.array([[1, 1], [1, 0]])
    np.testing.assert_allclose(losses.kl_reward(spec, sample_logp=logp, ref_logp=ref, mask=mask),
                               [0.25, -1.0], rtol=1e-6)
    out = losses.grpo_loss(spec, logp=logp, old_logp=logp, adv=jnp.ones(2), mask=mask)
    plain = losses.grpo_loss(dataclasses.replace(spec, beta=0.0), logp=logp, old_logp=logp,
                             adv=jnp.ones(2), mask=mask)
    assert out.num == plain.num and "kl" not in out.metrics


# --------------------------------------------------------------------- TIS and the mismatch KL


def _tis(mode, tis, cap, old, sample, mask):
    spec = make_spec("grpo", tis=tis, tis_mode=mode, tis_cap=cap)
    w, capped = losses.tis_weights(spec, old_logp=jnp.log(jnp.array(old)),
                                   sample_logp=jnp.log(jnp.array(sample)), mask=jnp.array(mask))
    return np.asarray(w), float(capped.num / capped.den)


def test_tis_weights_by_hand():
    # Ratios π_old / π_sampler: 0.5, 1.5, 3 on row 0; row 1: 2.5 then padding.
    old, sample = [[0.2, 0.3, 0.6], [0.5, 0.9]], [[0.4, 0.2, 0.2], [0.2, 0.1]]
    old, sample = ([r + [1.0] * (3 - len(r)) for r in x] for x in (old, sample))
    mask = [[1, 1, 1], [1, 0, 0]]
    w, frac = _tis("truncate", "token", 2.0, old, sample, mask)
    np.testing.assert_allclose(w, [[0.5, 1.5, 2.0], [2.0, 0, 0]], rtol=1e-5)
    assert frac == pytest.approx(2 / 4)
    w, frac = _tis("mask", "token", 2.0, old, sample, mask)
    np.testing.assert_allclose(w, [[0.5, 1.5, 0.0], [0.0, 0, 0]], rtol=1e-5)
    assert frac == pytest.approx(2 / 4)
    # Sequence: row 0's geometric mean (0.5·1.5·3)^(1/3) = 2.25^(1/3) ≈ 1.310 on all its
    # tokens (under the cap); row 1's is 2.5, over it: capped (truncate) or dropped (mask).
    g = 2.25 ** (1 / 3)
    w, frac = _tis("truncate", "sequence", 2.0, old, sample, mask)
    np.testing.assert_allclose(w, [[g, g, g], [2.0, 0, 0]], rtol=1e-5)
    assert frac == pytest.approx(1 / 4)
    w, frac = _tis("mask", "sequence", 1.2, old, sample, mask)
    np.testing.assert_allclose(w, [[0, 0, 0], [0, 0, 0]])
    assert frac == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_tis_scales_the_policy_gradient_by_its_weights(name):
    # On-policy (ratio 1, nothing clipped), token TIS truncate at 2 on ratios 0.5, 1.5, 3:
    # τ = 0.5, 1.5, 2. Token losses: ∂num/∂logp_t = -A c_t τ_t; sequence GSPO: every token
    # -A (Σ c τ / Σ c) c_t s = -A (4/3) / 3 with seq_mean_token_mean (c = 1/3).
    logp = jnp.log(jnp.array([[0.2, 0.3, 0.6]]))
    sample = jnp.log(jnp.array([[0.4, 0.2, 0.2]]))
    adv = jnp.full((1, 3), 2.0) if name == "ppo" else jnp.array([2.0])
    mask = jnp.ones((1, 3))
    out, grad = loss_and_grad(logp, name=name, old_logp=logp, adv=adv, mask=mask,
                              sample_logp=sample, tis="token", tis_cap=2.0)
    tau = np.array([0.5, 1.5, 2.0])
    want = (np.full(3, 4 / 3) if name == "gspo" else tau) / 3
    np.testing.assert_allclose(grad, [-2.0 * want], rtol=1e-5)
    np.testing.assert_allclose(out.weights, [want], rtol=1e-5)  # DESIGN §5's w, τ included
    assert float(out.metrics["tis_capped_frac"].num) == 1.0
    plain, g_plain = loss_and_grad(logp, name=name, old_logp=logp, adv=adv, mask=mask,
                                   sample_logp=sample)  # tis "none": the loss as before
    bare, g_bare = loss_and_grad(logp, name=name, old_logp=logp, adv=adv, mask=mask)
    assert float(plain.num) == float(bare.num) and np.array_equal(g_plain, g_bare)
    assert "tis_capped_frac" not in plain.metrics


def test_mismatch_kl_by_hand():
    # Sampler 0.5 vs trainer 0.25 on a token: k3 with u = ln(0.25 / 0.5) = e^u - u - 1
    # = 0.5 + ln 2 - 1; an equal token: 0; padding ignored.
    stat = losses.mismatch_kl(old_logp=jnp.log(jnp.array([[0.25, 0.3, 0.9]])),
                              sample_logp=jnp.log(jnp.array([[0.5, 0.3, 0.1]])),
                              mask=jnp.array([[1, 1, 0]]))
    np.testing.assert_allclose(stat.num / stat.den, (math.log(2) - 0.5) / 2, rtol=1e-6)


def test_entropy_bonus_gradient_sign_and_size():
    # -coef · aggregated entropy, token_mean over 3 tokens (den 3): ∂num/∂H_t = -coef, so the
    # loss's gradient is -coef / 3 per token; a gradient step on the logits raises H.
    spec = make_spec("grpo", entropy_coef=0.05, aggregation="token_mean")
    logits = jnp.array([[[2.0, 0.0, -1.0], [0.5, 0.4, 0.0], [3.0, -2.0, 0.0]]])
    mask = jnp.array([[1, 1, 0]])

    def ent(z):
        logp = jax.nn.log_softmax(z)
        return -jnp.sum(jnp.exp(logp) * logp, -1)

    h = ent(logits)
    g_h = jax.grad(lambda x: losses.entropy_bonus(spec, entropy=x, mask=mask)[0])(h)
    np.testing.assert_allclose(g_h, [[-0.05, -0.05, 0.0]], rtol=1e-6)
    num, metrics = losses.entropy_bonus(spec, entropy=h, mask=mask)
    np.testing.assert_allclose(num / metrics["entropy_loss"].den, -0.05 * (h[0, 0] + h[0, 1]) / 2,
                               rtol=1e-6)
    step = jax.grad(lambda z: losses.entropy_bonus(spec, entropy=ent(z), mask=mask)[0])(logits)
    assert float(ent(logits - 1.0 * step)[0, :2].sum()) > float(h[0, :2].sum())


@pytest.mark.parametrize("key, bad", [("kl_in", "both"), ("tis", "tokens"),
                                      ("tis_mode", "clip"), ("tis_cap", 1.0),
                                      ("entropy_coef", -0.1)])
def test_loss_knob_checks_name_the_key(key, bad):
    with pytest.raises(ValueError, match=rf"config\.loss\.{key}="):
        make_spec("grpo", **{key: bad})


def test_the_config_loss_section_is_a_loss_spec():
    """losses.LossSpec (a Protocol: the math imports no config) names fields the run config's
    loss section has, so `config.loss` is what every loss takes."""
    wanted = set(losses.LossSpec.__annotations__)
    assert wanted and wanted <= SPEC_FIELDS, wanted - SPEC_FIELDS
