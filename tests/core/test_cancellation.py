"""Tests of ibpo_jax/core/cancellation.py: prefix-trie nodes vs a Python trie, residuals by hand,
the transforms' guarantees checked on the actual gradient, batching over groups."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ibpo_jax.config import LossConfig
from ibpo_jax.config.registry import TRANSFORMS, UnknownNameError
from ibpo_jax.core import advantages, cancellation, losses

residual_terms = jax.jit(cancellation.residual_terms, static_argnames="whole_group_only")
residual = jax.jit(cancellation.cancellation_residual, static_argnames="whole_group_only")
bucketed = jax.jit(cancellation.bucketed_residual_terms, static_argnames="edges")
transform = jax.jit(cancellation.apply_transform, static_argnames="transform")
nodes_fn = jax.jit(cancellation.prefix_nodes)
CLIP = {"grpo": (0.2, 0.2), "gspo": (3e-4, 4e-4), "gspo_token": (3e-4, 4e-4)}  # papers' ε


def loss_spec(name, **kw):
    """The LossSpec of loss `name` with its paper clip range and no KL unless asked."""
    lo, hi = CLIP[name]
    return LossConfig(**{"name": name, "clip_eps_low": lo, "clip_eps_high": hi,
                              "beta": 0.0, **kw})


@functools.partial(jax.jit, static_argnames=("name", "aggregation"))
def token_weights(*, name, aggregation, **arrays):
    return losses.token_weights(loss_spec(name, aggregation=aggregation), **arrays)

# A group whose responses share prefixes of several depths (0 = padding; row 4's padding repeats
# row 0's continuation, which must not count as shared).
TOKENS = np.array([
    [5, 6, 7, 8, 2, 0],
    [5, 6, 7, 9, 2, 0],
    [5, 6, 3, 0, 0, 0],
    [5, 4, 7, 8, 0, 0],
    [5, 6, 7, 8, 0, 0],
])
LENGTHS = np.array([4, 5, 3, 4, 3])
MASK = np.arange(6)[None, :] < LENGTHS[:, None]
R = np.array([1.0, -1.0, 1.0, -1.0, -1.0])
PHI = np.array([0.0, 0.6, 0.0, 0.2, 0.9])


def _group_adv():
    return np.asarray(advantages.group_advantages(jnp.array(R), jnp.array(PHI), lam=0.5))


def test_prefix_nodes_by_hand():
    # t=0: {0,1,2,3,4}; t=1: {0,1,2,4} (token 6), {3}; t=2: {0,1,4} (7), {2}, {3} (7 after a
    # different prefix); t>=3: singletons (row 4 ends at t=2 even though its padding reads 8).
    n = nodes_fn(jnp.array(TOKENS), jnp.array(MASK))
    np.testing.assert_array_equal(n.count, [
        [5, 4, 3, 1, 0, 0],
        [5, 4, 3, 1, 1, 0],
        [5, 4, 1, 0, 0, 0],
        [5, 1, 1, 1, 0, 0],
        [5, 4, 3, 0, 0, 0],
    ])
    np.testing.assert_array_equal(n.rep, np.array([
        [1, 1, 1, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0],
    ], bool))
    whole = np.zeros((5, 6), bool)
    whole[:, 0] = True
    np.testing.assert_array_equal(n.whole, whole)


def _trie(tokens, mask):
    """prefix tuple -> [(i, t), ...], from a plain Python trie walk."""
    nodes = {}
    for i in range(tokens.shape[0]):
        for t in range(int(mask[i].sum())):
            nodes.setdefault(tuple(tokens[i, : t + 1]), []).append((i, t))
    return nodes


def _brute_terms(tokens, mask, adv, w, whole_only):
    n_valid = int(mask.any(1).sum())
    num = den = 0.0
    for members in _trie(tokens, mask).values():
        if len(members) < 2 or (whole_only and len(members) != n_valid):
            continue
        a = np.array([adv[m] for m in members], np.float64)
        ww = np.array([w[m] for m in members], np.float64)
        num += abs((a * ww).sum() - ww.mean() * a.sum())
        den += np.abs(a * ww).sum()
    return num, den


def _random_group(rng, g=6, t=9, vocab=3, common=0):
    lengths = rng.integers(0, t + 1, size=g)
    lengths[:2] = np.maximum(lengths[:2], common + 1)
    if common:
        lengths = np.maximum(lengths, common + 1)
    tokens = rng.integers(1, vocab + 1, size=(g, t))
    tokens[:, :common] = tokens[0, :common]
    mask = np.arange(t)[None, :] < lengths[:, None]
    return tokens, mask


@pytest.mark.parametrize("seed", range(4))
def test_nodes_and_residual_match_python_trie(seed):
    rng = np.random.default_rng(seed)
    tokens, mask = _random_group(rng, common=seed % 2 * 2)
    adv = rng.normal(size=tokens.shape).astype(np.float32)
    w = rng.uniform(0.1, 2.0, size=tokens.shape).astype(np.float32)
    n = nodes_fn(jnp.array(tokens), jnp.array(mask))
    count = np.zeros(tokens.shape, int)
    rep = np.zeros(tokens.shape, bool)
    for members in _trie(tokens, mask).values():
        for m in members:
            count[m] = len(members)
        rep[min(members)] = True
    np.testing.assert_array_equal(n.count, count)
    np.testing.assert_array_equal(n.rep, rep)
    for whole_only in (False, True):
        got = residual_terms(jnp.array(tokens), jnp.array(mask), jnp.array(adv), jnp.array(w),
                             whole_group_only=whole_only)
        np.testing.assert_allclose(got, _brute_terms(tokens, mask, adv, w, whole_only),
                                   rtol=1e-5, atol=1e-6)


def test_residual_by_hand():
    # Two responses [1, 2, 3] and [1, 2], A = [+1, -1], seq_mean_token_mean on-policy: w = 1/3,
    # 1/2. Each of the 2 shared nodes: |1/3 - 1/2 - w̄·0| = 1/6, Σ|Aw| = 5/6 -> (2/6) / (10/6).
    tokens = jnp.array([[1, 2, 3], [1, 2, 0]])
    mask = jnp.array([[1, 1, 1], [1, 1, 0]])
    adv = jnp.array([1.0, -1.0])
    lp = jnp.zeros((2, 3))
    w = token_weights(name="grpo", logp=lp, old_logp=lp, adv=adv, mask=mask,
                      aggregation="seq_mean_token_mean")
    np.testing.assert_allclose(residual(tokens, mask, adv, w), 0.2, rtol=1e-6)
    # Three responses [1, 2], [1, 2], [1, 3], A = [1, 3, -4], w = [[1, 1], [2, 2], [1, 1]]:
    #   t=0 (all): ΣAw = 1 + 6 - 4 = 3, ΣA = 0 -> 3; Σ|Aw| = 11
    #   t=1 ({0, 1}): ΣAw = 7, w̄ = 1.5, ΣA = 4 -> |7 - 6| = 1; Σ|Aw| = 7
    tokens = jnp.array([[1, 2], [1, 2], [1, 3]])
    mask = jnp.ones((3, 2))
    adv = jnp.array([1.0, 3.0, -4.0])
    w = jnp.array([[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]])
    np.testing.assert_allclose(residual(tokens, mask, adv, w), 4 / 18, rtol=1e-6)
    np.testing.assert_allclose(residual(tokens, mask, adv, w, whole_group_only=True), 3 / 11,
                               rtol=1e-6)


def _weights(name, agg, adv, logp, old):
    return token_weights(name=name, logp=jnp.array(logp), old_logp=jnp.array(old),
                         adv=jnp.array(adv), mask=jnp.array(MASK), aggregation=agg)


def test_exchangeable_weights_cancel_exactly_and_sequence_coupling_does_not():
    adv = _group_adv()
    lp = np.full(TOKENS.shape, -1.0, np.float32)
    tok, mask = jnp.array(TOKENS), jnp.array(MASK)
    # token_mean, on-policy, unclipped: w = 1 on every valid token -> exactly 0, also with
    # per-token advantages.
    delta = np.where(MASK, PHI[:, None] * (np.arange(6) < 2), 0.0)
    adv_tok = np.asarray(advantages.token_advantages(jnp.array(R), jnp.array(PHI),
                                                     jnp.array(delta), lam=0.5))
    for a, name in ((adv, "grpo"), (adv_tok, "grpo"), (adv, "gspo")):
        w = _weights(name, "token_mean", a, lp, lp)
        for whole in (False, True):
            assert residual(tok, mask, jnp.array(a), w, whole_group_only=whole) == 0.0
    # seq_mean_token_mean with unequal lengths (M1) breaks it.
    w_seq = _weights("grpo", "seq_mean_token_mean", adv, lp, lp)
    assert residual(tok, mask, jnp.array(adv), w_seq) > 0.05
    # GSPO off-policy: unequal s_i, even with token_mean.
    old = lp - np.array([1e-4, -2e-4, 0.0, 3e-4, -1e-4], np.float32)[:, None]
    w_gspo = _weights("gspo", "token_mean", adv, lp, old)
    assert residual(tok, mask, jnp.array(adv), w_gspo) > 1e-5
    # min_replace restores exchangeability, never raises a weight, leaves singletons alone.
    n = nodes_fn(tok, mask)
    for w in (w_seq, w_gspo):
        w2 = transform(tok, mask, jnp.array(adv), w, transform="min_replace")
        assert residual(tok, mask, jnp.array(adv), w2) < 1e-6
        assert np.all(np.asarray(w2) <= np.asarray(w))
        single = np.asarray(n.count) == 1
        np.testing.assert_array_equal(np.asarray(w2)[single], np.asarray(w)[single])


@functools.partial(jax.jit, static_argnames=("aggregation",))
def _reweighted_grad(logp, adv, w, mask, aggregation):
    def f(lp):
        spec = loss_spec("grpo", aggregation=aggregation)
        num, den = cancellation.reweighted_loss(spec, logp=lp, adv=adv, weights=w, mask=mask)
        return num / den

    return jax.grad(f)(logp)


@pytest.mark.parametrize("seed", range(3))
def test_adv_orthogonal_zeroes_the_net_gradient_of_whole_group_nodes(seed):
    rng = np.random.default_rng(10 + seed)
    tokens, mask = _random_group(rng, g=5, t=8, common=3)
    r = rng.choice([-1.0, 1.0], size=5)
    r[:2] = [-1.0, 1.0]
    adv = np.asarray(advantages.group_advantages(jnp.array(r), jnp.zeros(5), lam=0.5))
    logp = rng.normal(-1.0, 0.3, size=tokens.shape).astype(np.float32)
    old = (logp + rng.normal(0, 0.1, size=tokens.shape)).astype(np.float32)
    tok, m, a = jnp.array(tokens), jnp.array(mask), jnp.array(adv)
    w = token_weights(name="grpo", logp=jnp.array(logp), old_logp=jnp.array(old), adv=a, mask=m,
                      aggregation="seq_mean_token_mean")
    w2 = transform(tok, m, a, w, transform="adv_orthogonal")
    g = np.asarray(_reweighted_grad(jnp.array(logp), a, w2, m, "seq_mean_token_mean"))
    g0 = np.asarray(_reweighted_grad(jnp.array(logp), a, w, m, "seq_mean_token_mean"))
    whole = np.asarray(nodes_fn(tok, m).whole)
    assert whole[:, :3].all()  # the common prefix: at least 3 whole-group nodes
    node_net = g.sum(0, where=whole)  # all members of a whole-group node at t are all rows
    node_net0 = g0.sum(0, where=whole)
    cols = whole.any(0)
    np.testing.assert_allclose(node_net[cols], 0.0, atol=1e-6)
    assert np.abs(node_net0[cols]).max() > 1e-3  # it was not 0 before
    np.testing.assert_array_equal(g[~whole], g0[~whole])  # elsewhere untouched
    # A whole-group node with ‖A‖ = 0 keeps its weights.
    w3 = transform(tok, m, jnp.zeros(5), w, transform="adv_orthogonal")
    np.testing.assert_array_equal(w3, w)


def test_adv_orthogonal_with_token_level_advantages():
    # IBPO's token credit (DESIGN §3): A_it varies along a response, so the projection must use
    # the node's own A_t column, not a per-response A.
    rng = np.random.default_rng(3)
    tokens, mask = _random_group(rng, g=5, t=8, common=3)
    adv = rng.normal(size=tokens.shape).astype(np.float32)  # [G, T], differs per position
    w = rng.uniform(0.5, 1.5, size=tokens.shape).astype(np.float32)
    tok, m = jnp.array(tokens), jnp.array(mask)
    w2 = np.asarray(transform(tok, m, jnp.array(adv), jnp.array(w), transform="adv_orthogonal"))
    whole = np.asarray(nodes_fn(tok, m).whole)
    cols = whole.any(0)
    net = lambda ww: (adv * ww).sum(0, where=whole)[cols]  # noqa: E731  Σ_i A_it w_it per node
    np.testing.assert_allclose(net(w2), 0.0, atol=1e-5)
    assert np.abs(net(w)).max() > 1e-2
    np.testing.assert_array_equal(w2[~whole & mask], w[~whole & mask])


def test_residual_zero_does_not_imply_exchangeable():
    # One whole-group node with A = [1, 1], w = [1, 2]: Σ A w = 3 = w̄ Σ A, so num = 0 although
    # the weights differ (the docstring's caveat).
    tokens = jnp.array([[7], [7]])
    mask = jnp.ones((2, 1), bool)
    num, den = residual_terms(tokens, mask, jnp.array([1.0, 1.0]), jnp.array([[1.0], [2.0]]))
    assert float(num) == 0.0 and float(den) == 3.0


@pytest.mark.parametrize("name,agg", [("grpo", "seq_mean_token_mean"), ("gspo", "token_mean"),
                                      ("gspo_token", "seq_mean_token_sum_norm")])
def test_reweighted_loss_with_no_transform_reproduces_the_loss_gradient(name, agg):
    rng = np.random.default_rng(20)
    tokens, mask = _random_group(rng)
    adv = rng.normal(size=6).astype(np.float32)
    logp = rng.normal(-1.0, 0.3, size=tokens.shape).astype(np.float32)
    old = (logp + rng.normal(0, 2e-4, size=tokens.shape)).astype(np.float32)
    ref = (logp + rng.normal(0, 0.1, size=tokens.shape)).astype(np.float32)
    kw = dict(old_logp=old, adv=adv, mask=mask)
    spec = loss_spec(name, aggregation=agg, norm_const=9.0, beta=0.05)

    def loss(lp):
        out = losses.LOSSES.get(name)(spec, logp=lp, ref_logp=ref, **kw)
        return out.num / out.den

    w = losses.token_weights(spec, logp=jnp.array(logp), **kw)
    w = cancellation.apply_transform(tokens, mask, adv, w, transform="none")

    def surrogate(lp):
        num, den = cancellation.reweighted_loss(spec, logp=lp, adv=adv, weights=w, mask=mask,
                                                ref_logp=ref)
        return num / den

    np.testing.assert_allclose(jax.grad(surrogate)(jnp.array(logp)),
                               jax.grad(loss)(jnp.array(logp)), rtol=1e-5, atol=1e-8)


def test_bucketed_residual_by_hand():
    # G = 4 valid responses (row 3 padded with 1s that must be ignored), A = [1, 1, -1, -1]:
    #   id 1: rows 0-3 (df 4/4 -> last bucket): Aw = 1, 2, -1, -1 -> |1 - (5/4)·0| = 1; mass 5
    #   id 2: r0 twice + r1 (df 2/4 = 0.5 -> bucket (0.25, 0.5]); occurrences count separately:
    #         Aw = 1, 1, 2 -> 4, w̄ = 4/3, ΣA = 3 -> 0; mass 4
    #   id 3: r1, r2 (df 0.5): Aw = 2, -1 -> |1 - 1.5·0| = 1; mass 3
    #   id 6: twice in r3 only (df 1) -> not shared; ids 4, 5: single.
    tokens = jnp.array([[1, 2, 2, 0], [1, 3, 2, 0], [1, 3, 4, 0], [1, 5, 6, 6]])
    tokens = tokens.at[0, 3].set(1).at[1, 3].set(1).at[2, 3].set(1)
    mask = jnp.array([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    w = jnp.array([[1.0] * 4, [2.0] * 4, [1.0] * 4, [1.0] * 4])
    adv = jnp.array([1.0, 1.0, -1.0, -1.0])
    num, den = bucketed(tokens, mask, adv, w)
    np.testing.assert_allclose(num, [0, 1, 0, 1], atol=1e-6)
    np.testing.assert_allclose(den, [0, 7, 0, 5], atol=1e-6)
    np.testing.assert_allclose(cancellation.bucketed_residual(tokens, mask, adv, w),
                               [0, 1 / 7, 0, 1 / 5], rtol=1e-6)
    num, den = bucketed(tokens, mask, adv, w, edges=(1.0,))  # one bucket: everything shared
    np.testing.assert_allclose([num[0], den[0]], [2, 12], rtol=1e-6)


def test_shared_logprob_drift_by_hand():
    # Shared nodes of TOKENS: (0,0) [whole group], (0,1), (0,2) at their representative row 0.
    after = jnp.array(np.arange(30, dtype=np.float32).reshape(5, 6))
    s = cancellation.shared_logprob_drift(TOKENS, MASK, jnp.zeros((5, 6)), after)
    np.testing.assert_allclose([s.num, s.den], [0 + 1 + 2, 3])
    s = cancellation.shared_logprob_drift(TOKENS, MASK, jnp.zeros((5, 6)), after,
                                          whole_group_only=True)
    np.testing.assert_allclose([s.num, s.den], [0, 1])


def test_vmapped_over_groups_matches_one_at_a_time():
    rng = np.random.default_rng(30)
    groups = [_random_group(rng, g=4, t=7, common=c) for c in (0, 2, 3)]
    tokens = np.stack([g[0] for g in groups])
    mask = np.stack([g[1] for g in groups])
    adv = rng.normal(size=(3, 4)).astype(np.float32)
    w = rng.uniform(0.1, 1.0, size=tokens.shape).astype(np.float32)
    args = tuple(jnp.array(x) for x in (tokens, mask, adv, w))
    batched = {
        "terms": jax.jit(jax.vmap(cancellation.residual_terms))(*args),
        "bucketed": jax.jit(jax.vmap(cancellation.bucketed_residual_terms))(*args),
        **{t: jax.jit(jax.vmap(functools.partial(cancellation.apply_transform, transform=t)))(
            *args) for t in TRANSFORMS.names()},
    }
    for b in range(3):
        one = tuple(x[b] for x in args)
        np.testing.assert_allclose([x[b] for x in batched["terms"]], residual_terms(*one),
                                   rtol=1e-6)
        np.testing.assert_allclose([x[b] for x in batched["bucketed"]], bucketed(*one),
                                   rtol=1e-6)
        for t in TRANSFORMS.names():
            np.testing.assert_allclose(batched[t][b], transform(*one, transform=t), rtol=1e-6)


def test_bad_inputs_name_the_culprit():
    tok, m = jnp.zeros((3, 4), jnp.int32), jnp.ones((3, 4))
    with pytest.raises(ValueError, match="weights"):
        cancellation.residual_terms(tok, m, jnp.zeros(3), jnp.zeros((3, 5)))
    with pytest.raises(ValueError, match="adv"):
        cancellation.residual_terms(tok, m, jnp.zeros(4), jnp.zeros((3, 4)))
    with pytest.raises(ValueError, match="mask"):
        cancellation.prefix_nodes(tok, jnp.ones((3, 5)))
    with pytest.raises(ValueError, match="edges"):
        cancellation.bucketed_residual_terms(tok, m, jnp.zeros(3), jnp.zeros((3, 4)),
                                             edges=(0.5, 0.25, 1.0))
    with pytest.raises(UnknownNameError, match="min_replace"):
        cancellation.apply_transform(tok, m, jnp.zeros(3), jnp.zeros((3, 4)), transform="min")


@pytest.mark.parametrize("eps,positive", [((0.2, 0.2), True), ((0.9, 10.0), False)])
def test_one_sided_clipping_shows_in_the_residual_only_off_ratio_one(eps, positive):
    # DESIGN §5 (M2): two responses on the same nodes, A = [+1, -1]. At ratio e^0.5 > 1 + ε
    # GRPO's clip zeroes only the A > 0 copy's weight, so the shared nodes' weights differ;
    # with a range so wide that nothing is clipped the weights stay exchangeable. At ratio 1
    # nothing is ever clipped, which is why the trainer also logs the residual at the current
    # ratios.
    from ibpo_jax.config import LossConfig

    spec = LossConfig(name="grpo", aggregation="token_mean", clip_eps_low=eps[0],
                      clip_eps_high=eps[1], beta=0.0)
    tokens = jnp.array([[7, 8, 9], [7, 8, 9]])
    mask = jnp.ones((2, 3), bool)
    adv = jnp.array([1.0, -1.0])
    old = jnp.full((2, 3), -1.0)
    for shift, expect_positive in ((0.5, positive), (0.0, False)):
        w = losses.token_weights(spec, logp=old + shift, old_logp=old, adv=adv, mask=mask)
        num, den = residual_terms(tokens, mask, adv, w)
        assert (float(num) > 1e-6) == expect_positive, (shift, float(num))
        assert float(den) > 0
