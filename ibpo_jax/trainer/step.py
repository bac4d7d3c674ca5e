"""The device side of one RL step, as two jitted pure functions.

`credit`:  rollout -> φ (comparison kernel, DESIGN §2) -> advantages (DESIGN §3) + statistics
           (trainer/credit.py, re-exported here).
`update`:  old / reference log-probs -> epochs x minibatches of policy updates, each the exact
           gradient of Σnum / Σden over its micro-batches (DESIGN §4), cancellation diagnostics
           and transforms (DESIGN §5); an update whose loss, gradient or new parameters are
           not finite is skipped.

Both take and return device arrays; the trainer calls them back to back with no host round trip
(only reward scoring, before `credit`, leaves the device, and the host plans the packing from
the lengths it already has). Rows are prompt-major: row b*G + g is sample g of prompt b, so [N]
reshapes to [B, G] groups. The update's model passes run in one of three layouts
(`StepSpec.layout`, config `optim.layout`): "grouped", each prompt encoded once for its G
responses (`models.response_logprobs`); "packed", rollout rows packed several to a model row as a
`packing.Packing` says; "rows", the rollout's own rows. Losses, advantages and diagnostics stay per
rollout row. Shapes: N = B*G rows, P prompt columns (left-padded), R response columns, U
comparison units, M model rows (packed, or N) of W = P + R columns.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ibpo_jax import models
from ibpo_jax.config.registry import ESTIMATORS, KL_ESTIMATORS, LOSSES
from ibpo_jax.core import advantages, cancellation, losses
from ibpo_jax.trainer import packing
from ibpo_jax.trainer.credit import Credit, Rollout, credit, response_mask  # noqa: F401  (credit, Credit, Rollout: the step's API)
from ibpo_jax.trainer.credit import groups as _groups
from ibpo_jax.trainer.spec import StepSpec  # noqa: F401  (step.StepSpec: the step's API)
from ibpo_jax.trainer.state import TrainState, policy_params

# ------------------------------------------------------------------------------ update


class _Batch(NamedTuple):
    """The update's inputs: per rollout row its training arrays ([N, ...]) and, for the
    "packed" and "rows" layouts, the model's rows (`packing`) and where its response sits in
    them (None for "grouped", which reads prompt and response directly)."""

    tokens: jax.Array | None  # [M, W] packed rows
    segments: jax.Array | None  # [M, W] int32, row i's tokens carry i + 1
    bin: jax.Array  # [N] packed row of each rollout row
    first: jax.Array | None  # [N] packed column of its first response token
    prompt: jax.Array  # [N, P]
    prompt_len: jax.Array  # [N]
    mask: jax.Array  # [N, R]
    response: jax.Array  # [N, R]
    sample_logp: jax.Array  # [N, R] the sampler's log-probs (for the mismatch metric)
    old_logp: jax.Array  # [N, R], or [N, 0] when π_old is the policy itself (single update)
    ref_logp: jax.Array  # [N, R] (zeros when β = 0)
    adv: jax.Array  # [N] or [N, R]
    old_values: jax.Array  # [N, R] (PPO) or [N, 0]
    returns: jax.Array  # [N, R] (PPO) or [N, 0]
    kl_anchor: jax.Array | None = None  # [N] per-row extra KL weight (Rollout.kl_anchor)


def _chunk_stats(spec: StepSpec, params: Any, b: _Batch, rows: jax.Array, *,
                 entropy: bool = False, values: bool = False, key: jax.Array | None = None):
    """Log-probs (entropy, values) [N, R] of the rollout rows inside model rows `rows` [C]
    (0 for the others), and which rollout rows those are [N] bool. "grouped": `rows` are
    rollout rows, whole groups in order. `key`: LoRA dropout's (gradient passes only)."""
    if spec.layout == "grouped":
        heads = rows.reshape(-1, spec.group_size)[:, 0]  # each group's first row: its prompt
        out = models.response_logprobs(
            spec.model, spec.options, params, b.prompt[heads], b.prompt_len[heads],
            b.response[rows], temperature=spec.temperature, return_entropy=entropy,
            return_values=values, logits_chunk=spec.logits_chunk, dropout_key=key)
        n = b.mask.shape[0]
        put = lambda x: None if x is None else jnp.zeros((n, x.shape[1]), x.dtype).at[rows].set(x)
        here = jnp.zeros((n,), bool).at[rows].set(True)
        return put(out.logprobs), put(out.entropy), put(out.values), here
    out = models.token_logprobs(spec.model, spec.options, params, b.tokens[rows],
                                segment_ids=b.segments[rows], temperature=spec.temperature,
                                return_entropy=entropy, return_values=values,
                                logits_chunk=spec.logits_chunk, dropout_key=key)
    local = packing.local_rows(rows, b.bin, b.tokens.shape[0])
    r = b.mask.shape[1]
    get = lambda x, first: None if x is None else packing.unpack(x, local, first, r)
    # The value of the state before response token j is the head on the tokens before it.
    return (get(out.logprobs, b.first), get(out.entropy, b.first),
            get(out.values, b.first - 1), local >= 0)


def _frozen_stats(spec: StepSpec, params: Any, b: _Batch, plan: packing.Packing, *,
                  entropy: bool = False, values: bool = False):
    """`_chunk_stats` of frozen params (π_ref, π_old) for every rollout row, in sequence over
    chunks the size of one gradient micro-batch (minibatches x microbatches chunks): they
    neither set the peak memory nor leave the working set the micro-batch size was chosen
    for (no activations are kept for a backward pass)."""
    params = jax.lax.stop_gradient(params)
    units, n = plan.rows // plan.unit, spec.optim.microbatches * spec.optim.minibatches
    # Chunk k = partition units k, k + n, ...: every chunk spans all data shards (no idle
    # devices).
    chunks = jnp.arange(units).reshape(units // n, n).T  # [n, units / n]
    chunks = (chunks[..., None] * plan.unit + jnp.arange(plan.unit)).reshape(n, -1)
    one = lambda rows: _chunk_stats(spec, params, b, rows, entropy=entropy, values=values)[:3]
    out = one(chunks[0])
    if n > 1:  # a rollout row lies in exactly one chunk: the chunks' outputs add up
        out, _ = jax.lax.scan(lambda acc, rows: (jax.tree.map(jnp.add, acc, one(rows)), None),
                              out, chunks[1:])
    return out


def _per_group(spec: StepSpec, fn, b: _Batch, weights: jax.Array):
    """vmaps fn(tokens, mask, adv, weights) of one group over the groups of b."""
    g = spec.group_size
    adv_tok = losses.token_adv(b.adv, b.mask)
    return jax.vmap(fn)(_groups(b.response, g), _groups(b.mask, g), _groups(adv_tok, g),
                        _groups(weights, g))


def _transformed(spec: StepSpec, b: _Batch, weights: jax.Array) -> jax.Array:
    w = _per_group(spec, lambda t, m, a, w: cancellation.apply_transform(
        t, m, a, w, transform=spec.cancellation.transform), b, weights)
    return w.reshape(weights.shape)


def _diagnostics(spec: StepSpec, b: _Batch, old_logp: jax.Array, entropy: jax.Array
                 ) -> dict[str, losses.Stat]:
    """DESIGN §5 cancellation residuals of the on-policy gradient (ratio 1), entropy and the
    sampler-vs-trainer log-prob mismatch, over the whole rollout batch."""
    sg = jax.lax.stop_gradient
    old_logp, entropy = sg(old_logp), sg(entropy)
    w = losses.token_weights(spec.loss, logp=old_logp, old_logp=old_logp, adv=b.adv,
                             mask=b.mask)

    def residual(weights, whole):
        num, den = _per_group(spec, lambda t, m, a, ww: cancellation.residual_terms(
            t, m, a, ww, whole_group_only=whole), b, weights)
        return losses.Stat(num.sum(), den.sum())

    n_tok = b.mask.sum().astype(jnp.float32)
    out = {
        "cancellation_residual": residual(w, False),
        "cancellation_residual_whole": residual(w, True),
        "entropy": losses.Stat(jnp.sum(jnp.where(b.mask, entropy, 0.0)), n_tok),
        "logprob_mismatch": losses.Stat(
            jnp.sum(jnp.where(b.mask, jnp.abs(b.sample_logp - old_logp), 0.0)), n_tok),
        "mismatch_kl": losses.mismatch_kl(old_logp=old_logp, sample_logp=b.sample_logp,
                                          mask=b.mask),
    }
    # Context-free residual per document-frequency bucket (upper edges of
    # cancellation.DEFAULT_BUCKET_EDGES): "_df50" = ids in > 25 % and <= 50 % of the responses.
    num, den = _per_group(spec, cancellation.bucketed_residual_terms, b, w)  # [B, K] each
    for k, edge in enumerate(cancellation.DEFAULT_BUCKET_EDGES):
        out[f"cancellation_residual_df{round(100 * edge)}"] = losses.Stat(
            num[:, k].sum(), den[:, k].sum())
    if spec.cancellation.transform != "none":
        out["cancellation_residual_transformed"] = residual(_transformed(spec, b, w), False)
    return out


def policy_terms(spec: StepSpec, b: _Batch, logp: jax.Array, old_logp: jax.Array,
                 entropy: jax.Array | None = None):
    """(num, LossOutput) of the run's policy loss (KL included; a cancellation transform's
    reweighted numerator when one is set, and its weights as `out.weights`: the ones the
    update applies; TIS on the sampler's log-probs; the entropy bonus of `entropy` [N, R])
    on the rows `b.mask` selects."""
    ref_logp = b.ref_logp if spec.kl_in_loss else None  # π_ref's, for the KL term
    out = LOSSES.get(spec.loss.name, key="config.loss.name")(
        spec.loss, logp=logp, old_logp=old_logp, adv=b.adv, mask=b.mask, ref_logp=ref_logp,
        sample_logp=b.sample_logp)
    num = out.num
    if spec.cancellation.transform != "none":
        out = out._replace(weights=_transformed(spec, b, out.weights))
        num, _ = cancellation.reweighted_loss(  # the chunk holds whole groups (identity plan)
            spec.loss, logp=logp, adv=b.adv, weights=out.weights, mask=b.mask,
            ref_logp=ref_logp)
    if b.kl_anchor is not None:
        num = num + _anchor_num(spec, b, logp)
    if entropy is not None and spec.loss.entropy_coef > 0:
        bonus, metrics = losses.entropy_bonus(spec.loss, entropy=entropy, mask=b.mask)
        num, out = num + bonus, out._replace(metrics={**out.metrics, **metrics})
    return num, out


def _anchor_num(spec: StepSpec, b: _Batch, logp: jax.Array) -> jax.Array:
    """Σ_i w_i · (the loss aggregation of row i's per-token KL to π_ref), w = b.kl_anchor:
    the aggregation's coefficients are per row, so this numerator shares the loss's den."""
    # Padding zeroed before the estimator: its values there must not reach the gradient.
    kl = KL_ESTIMATORS.get(spec.loss.kl_estimator)(jnp.where(b.mask, logp, 0.0),
                                                   jnp.where(b.mask, b.ref_logp, 0.0))
    coeff, _ = losses.coefficients(spec.loss, b.mask)
    return jnp.sum(coeff * b.kl_anchor[:, None] * jnp.where(b.mask, kl, 0.0))


def group_policy_terms(spec: StepSpec, params: Any, b: _Batch, group: jax.Array,
                       through: jax.Array | None = None):
    """(num, den) of the policy loss restricted to group `group` (an int32 scalar, or [K]
    groups), on-policy (ratio 1): the per-group term of DESIGN §3's policy-gradient variance.
    `through` [N, R] bool: the gradient flows through those tokens' log-probs only (every
    coefficient of the loss unchanged), so ∇num is the part of the update's gradient those
    tokens carry. Needs the "grouped" layout."""
    rows = (jnp.atleast_1d(group)[:, None] * spec.group_size
            + jnp.arange(spec.group_size)).reshape(-1)
    logp, _, _, here = _chunk_stats(spec, params, b, rows)
    if through is not None:
        logp = jnp.where(through, logp, jax.lax.stop_gradient(logp))
    num, out = policy_terms(spec, b._replace(mask=b.mask & here[:, None]), logp,
                            jax.lax.stop_gradient(logp))
    return num, out.den


def _micro_loss(spec: StepSpec, params: Any, b: _Batch, rows: jax.Array,
                key: jax.Array | None = None):
    """(num, (den, metrics, aux)) of the rollout rows in packed rows `rows` (`key`: LoRA
    dropout's). aux: with one update per rollout, this pass's (detached) log-probs and
    entropy, the on-policy ones."""
    single = spec.single_update
    logp, entropy, values, here = _chunk_stats(spec, params, b, rows,
                                               entropy=single or spec.loss.entropy_coef > 0,
                                               values=spec.is_ppo, key=key)
    b = b._replace(mask=b.mask & here[:, None])  # rows of other chunks count nowhere
    # One update per rollout: π_old is the current policy, so this very pass is the trainer's
    # recomputation of the old log-probs (no separate forward pass).
    # rollout.off_policy_steps 1: π_old is the policy that sampled the batch, a step behind
    # the one differentiated (trainer/offpolicy.py): the sampler's own log-probs; so with
    # rollout.partial, whose rows' tokens were sampled by several steps' policies.
    old_logp = (b.sample_logp if spec.rollout.off_policy_steps or spec.rollout.partial
                else jax.lax.stop_gradient(logp) if single else b.old_logp)
    num, out = policy_terms(spec, b, logp, old_logp, entropy)
    metrics = dict(out.metrics)
    if spec.layout != "packed":  # whole groups per chunk: the residual at the current ratios
        num_r, den_r = _per_group(spec, cancellation.residual_terms, b,  # of what it applies
                                  jax.lax.stop_gradient(out.weights))
        metrics["cancellation_residual_updates"] = losses.Stat(num_r.sum(), den_r.sum())
    if spec.is_ppo:
        vl = losses.value_loss(spec.loss, values=values, old_values=b.old_values,
                               returns=b.returns, mask=b.mask)
        num = num + spec.loss.value_coef * vl.num
        metrics.update(vl.metrics)
    aux = (jax.lax.stop_gradient(logp), jax.lax.stop_gradient(entropy)) if single else ()
    return num, (out.den, metrics, aux)


def _gradients(spec: StepSpec, params: Any, b: _Batch, chunks: jax.Array, frozen: Any = None,
               key: jax.Array | None = None):
    """Exact gradient of Σnum / Σden over micro-batches, the packed rows chunks[k] [C] each,
    with respect to the trained `params` (LoRA: the adapters over the `frozen` base); also the
    metrics and the added-up aux of the micro-batches. `key`: this update's LoRA dropout key
    (micro-batch k's: fold_in(key, k)), or None."""
    micro_key = lambda k: None if key is None else jax.random.fold_in(key, k)
    grad_fn = jax.grad(lambda prm, rows, k: _micro_loss(
        spec, policy_params(spec.options, frozen, prm), b, rows, k), has_aux=True)
    grads, (den, metrics, aux) = grad_fn(params, chunks[0], micro_key(0))
    if spec.optim.microbatches > 1:
        def body(carry, xs):  # xs: rows, or (rows, micro-batch index) with dropout
            (acc, den_acc, m_acc, aux_acc), (rows, k) = carry, xs if key is not None else (xs, 0)
            g, (d, m, a) = grad_fn(params, rows, micro_key(k))
            return (jax.tree.map(jnp.add, acc, g), den_acc + d, losses.combine_metrics(m_acc, m),
                    jax.tree.map(jnp.add, aux_acc, a)), None

        xs = chunks[1:] if key is None else (chunks[1:], jnp.arange(1, spec.optim.microbatches))
        (grads, den, metrics, aux), _ = jax.lax.scan(body, (grads, den, metrics, aux), xs)
    grads = jax.tree.map(lambda x: losses.safe_div(x, den), grads)
    return grads, metrics, aux


# The update, phase by phase: prepare the batch (packing, frozen passes), advantages (PPO),
# the optimizer updates (each guarded against non-finite values), reduce the metrics.


def _rows_batch(spec: StepSpec, rollout: Rollout, adv: jax.Array, plan: packing.Packing
                ) -> _Batch:
    """The rollout's rows as the update's inputs (packed per `plan` unless "grouped"), with
    advantages `adv`; no model pass yet (old / reference log-probs empty / zeros)."""
    mask = response_mask(rollout.response_len, rollout.response.shape[1])
    tokens = segments = first = None
    if spec.layout != "grouped":
        tokens, segments, first = packing.pack(plan, rollout.prompt, rollout.prompt_len,
                                               rollout.response, rollout.response_len)
    empty = jnp.zeros((mask.shape[0], 0))
    if rollout.valid is not None:  # an invalid row has no tokens of its own
        mask = mask & rollout.valid[:, None]
    return _Batch(tokens, segments, plan.bin, first, rollout.prompt, rollout.prompt_len, mask,
                  rollout.response, rollout.sample_logp, empty, jnp.zeros(mask.shape),
                  adv, empty, empty, rollout.kl_anchor)


def reward_kl(spec: StepSpec, ref_params: Any, rollout: Rollout) -> jax.Array:
    """[N] β · Σ_t k(logπ_sampler, logπ_ref) per row (`losses.kl_reward`): what
    `loss.kl_in = "reward"` takes off R before `credit` (`Rollout.kl_penalty`). One π_ref
    pass over the rollout's own rows (identity plan) in the update's micro-batch chunks; the
    policy side is the sampler's own log-probs (no policy pass)."""
    n = rollout.prompt.shape[0]
    plan = packing.Packing(jnp.arange(n, dtype=jnp.int32),
                        (rollout.prompt.shape[1] - rollout.prompt_len).astype(jnp.int32), n,
                        spec.group_size)
    batch = _rows_batch(spec, rollout, jnp.zeros_like(rollout.reward), plan)
    ref_logp = _frozen_stats(spec, ref_params, batch, plan)[0]
    return losses.kl_reward(spec.loss, sample_logp=rollout.sample_logp, ref_logp=ref_logp,
                            mask=batch.mask)


def prepare_batch(spec: StepSpec, state: TrainState, ref_params: Any, rollout: Rollout,
                   cred: Credit, plan: packing.Packing) -> tuple[_Batch, jax.Array | None]:
    """The update's inputs per rollout row, with π_ref's log-probs (β > 0) and, when π_old is
    frozen across several updates, its log-probs, values and entropy from one pass up front.
    Returns (batch, π_old's entropy or None)."""
    batch = _rows_batch(spec, rollout, cred.adv, plan)
    empty = jnp.zeros((batch.mask.shape[0], 0))
    if spec.kl_in_loss or rollout.kl_anchor is not None:
        batch = batch._replace(ref_logp=_frozen_stats(spec, ref_params, batch, plan)[0])
    entropy = None
    if not spec.single_update:  # π_old is frozen across several updates: one pass up front
        policy = policy_params(spec.options, ref_params, state.params)
        old_logp, entropy, values = _frozen_stats(spec, policy, batch, plan, entropy=True,
                                                  values=spec.is_ppo)
        batch = batch._replace(old_logp=old_logp,
                               old_values=empty if values is None else values)
    return batch, entropy


def with_advantages(spec: StepSpec, batch: _Batch, cred: Credit) -> _Batch:
    """PPO: GAE advantages and returns from the value head (DESIGN §3); the group
    estimators' advantages came with `credit`."""
    if not spec.is_ppo:
        return batch
    adv, returns = advantages.ppo_advantages(
        terminal_reward=cred.shaped.reshape(-1), values=batch.old_values, mask=batch.mask,
        gamma=spec.advantage.gamma, lam=spec.advantage.gae_lambda,
        whiten=spec.advantage.normalize_std, eps=spec.advantage.eps,
        estimator=ESTIMATORS.get(spec.estimator))
    return batch._replace(adv=adv, returns=returns)


def _guarded_update(spec: StepSpec, optimizer: optax.GradientTransformation, st: TrainState,
                    batch: _Batch, rows: jax.Array, frozen: Any = None,
                    key: jax.Array | None = None):
    """One optimizer update on the micro-batches `rows` [microbatches, C] (`key`: its LoRA
    dropout key, or None). Not applied (state kept, counted as skipped) when the loss, the
    gradient or any updated parameter is not finite. Returns (state, (metrics, grad norm,
    skipped, aux))."""
    grads, m, aux = _gradients(spec, st.params, batch, rows, frozen, key)
    grad_norm = optax.global_norm(grads)
    updates, opt_state = optimizer.update(grads, st.opt_state, st.params)
    params = optax.apply_updates(st.params, updates)
    finite_params = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(params)]
    ok = (jnp.isfinite(grad_norm) & jnp.isfinite(losses.safe_div(*m["pg_loss"]))
          & jnp.all(jnp.stack(finite_params)))
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
    new = TrainState(keep(params, st.params), keep(opt_state, st.opt_state), st.step)
    return new, (m, grad_norm, ~ok, aux)


_DROPOUT_STREAM = 0x10AD  # update key -> LoRA dropout keys (epochs fold in 0, 1, ...)


def _update_orders(spec: StepSpec, units: int, key: jax.Array) -> jax.Array:
    """[epochs * minibatches, units per update]: each epoch a permutation of the partition
    units (whole groups, or packed rows) split into minibatches."""
    minibatches = spec.optim.minibatches
    orders = []
    for epoch in range(spec.optim.epochs):
        order = jnp.arange(units)
        if minibatches > 1:
            order = jax.random.permutation(jax.random.fold_in(key, epoch), units)
        orders.append(order.reshape(minibatches, units // minibatches))
    return jnp.concatenate(orders, axis=0)


def _reduce_metrics(upd_metrics: dict, grad_norms: jax.Array, skipped: jax.Array
                    ) -> dict[str, jax.Array]:
    """Scalars over the step's updates (the first is on-policy: ratio 1, nothing clipped; the
    later ones show how far the minibatch updates move the policy): Stats summed, so token
    means are exact over the step; extremes over all updates; the grad norm over the applied
    updates (when every update was skipped, their non-finite norm)."""
    def over_updates(k, v):
        if isinstance(v, losses.Stat):
            return losses.safe_div(jnp.sum(v.num), jnp.sum(v.den))
        return jnp.min(v) if k.endswith("_min") else jnp.max(v) if k.endswith("_max") \
            else jnp.mean(v)

    metrics = {k: over_updates(k, v) for k, v in upd_metrics.items()}
    applied = ~skipped
    metrics["grad_norm"] = jnp.where(
        jnp.any(applied),
        losses.safe_div(jnp.sum(jnp.where(applied, grad_norms, 0.0)),
                        jnp.sum(applied).astype(jnp.float32)),
        jnp.mean(grad_norms))
    metrics["updates_skipped_nonfinite"] = jnp.sum(skipped)
    return metrics


def _drift_metrics(spec: StepSpec, params: Any, batch: _Batch, plan: packing.Packing,
                   before: jax.Array) -> dict[str, jax.Array]:
    """DESIGN §5: mean Δ log π on shared nodes between π_old (`before` [N, R]) and `params`."""
    after = _frozen_stats(spec, params, batch, plan)[0]
    g, out = spec.group_size, {}
    for name, whole in (("shared_logprob_drift", False), ("shared_logprob_drift_whole", True)):
        drift = jax.vmap(functools.partial(cancellation.shared_logprob_drift,
                                           whole_group_only=whole))(
            _groups(batch.response, g), _groups(batch.mask, g), _groups(before, g),
            _groups(after, g))
        out[name] = losses.safe_div(jnp.sum(drift.num), jnp.sum(drift.den))
    return out


def update(spec: StepSpec, optimizer: optax.GradientTransformation, state: TrainState,
           ref_params: Any, rollout: Rollout, cred: Credit, key: jax.Array,
           plan: packing.Packing) -> tuple[TrainState, dict[str, jax.Array]]:
    """Policy updates on one rollout batch (epochs x minibatches optimizer steps), the model
    passes in `spec.layout`: on the model rows `plan` makes ("packed", "rows"), or on whole
    groups ("grouped": `plan` is the identity plan, partition unit G)."""
    batch, entropy = prepare_batch(spec, state, ref_params, rollout, cred, plan)
    batch = with_advantages(spec, batch, cred)
    # LoRA dropout (gradient passes only): update u's key fold_in(fold_in(key, stream), u),
    # a function of the step's key alone (resume and any mesh draw the same masks).
    drop = jax.random.fold_in(key, _DROPOUT_STREAM) if spec.options.lora_dropout else None

    def one_update(st: TrainState, xs):  # [units of this minibatch] (, its update index)
        idx, u = xs if drop is not None else (xs, 0)
        rows = (idx[:, None] * plan.unit + jnp.arange(plan.unit)[None, :]).reshape(
            spec.optim.microbatches, -1)
        return _guarded_update(spec, optimizer, st, batch, rows, ref_params,
                               None if drop is None else jax.random.fold_in(drop, u))

    orders = _update_orders(spec, plan.rows // plan.unit, key)
    xs = orders if drop is None else (orders, jnp.arange(orders.shape[0]))
    state, (upd_metrics, grad_norms, skipped, aux) = jax.lax.scan(one_update, state, xs)
    # On-policy diagnostics: from π_old's pass up front, or (one update) the gradient pass's.
    old_logp = batch.old_logp
    if spec.single_update:
        old_logp, entropy = (x[0] for x in aux)
    metrics = losses.finalize_metrics(_diagnostics(spec, batch, old_logp, entropy))
    metrics.update(_reduce_metrics(upd_metrics, grad_norms, skipped))
    if spec.cancellation.log_drift:
        metrics.update(_drift_metrics(spec, policy_params(spec.options, ref_params, state.params),
                                      batch, plan, old_logp))
    return state._replace(step=state.step + 1), metrics


def step_functions(spec: StepSpec, optimizer: optax.GradientTransformation,
                   state_shardings: Any) -> tuple[Any, Any]:
    """The step's two jitted programs as the trainer runs them, (credit, update): the update
    donates the state and keeps its layouts (`ibpo_jax.plan` compiles these very functions)."""
    credit_fn = jax.jit(functools.partial(credit, spec))
    update_fn = jax.jit(functools.partial(update, spec, optimizer), donate_argnums=0,
                        out_shardings=(state_shardings, None))
    return credit_fn, update_fn
