"""Policy objectives, loss aggregations and KL estimators (paper §3.4, DESIGN §4).

Shapes: B sequences (responses), T response positions, V vocabulary. `mask` [B, T] marks the
response tokens the policy loss covers (incl. EOS). Every policy loss is a registered function
(`registry.LOSSES`) taking the hyperparameters as ONE `LossSpec` (the config's `loss` section)
plus the arrays, keyword-only:

    grpo_loss(spec, *, logp, old_logp, adv, mask, ref_logp=None, logits=None, sample_logp=None)
        -> LossOutput(num, den, metrics, weights)

The loss is num / den; num and den are kept apart so that Σ num / Σ den over micro-batches
equals the full-batch loss (and its gradient).

Aggregations (`registry.AGGREGATIONS`) are per-token coefficients c_it plus a denominator:
num = Σ_it c_it ℓ_it. Sequence-level losses (GSPO) put their ℓ_i on every valid token of the
sequence first, as TRL does, so seq_mean_token_mean gives mean_i ℓ_i and the aggregations treat
all losses alike. Rows with no valid token get c = 0 and are not counted in den.

Ratios: ρ = exp(logπ_θ - logπ_old) from a log ratio that is zeroed on padding and clamped to
±LOG_RATIO_CLAMP before exp (a clamped token carries no gradient). The clipped surrogate picks its
branch with an explicit test instead of `minimum`, so the gradient is exactly -A·ρ·1[unclipped]
also at the clip boundary (`minimum` splits a tie's gradient in halves).

Token weights (DESIGN §5): `LossOutput.weights` (and `token_weights`) is w with ∂num_pg/∂logp_it
= -A_it · w_it, the policy part of the gradient without its advantage (ratio factors, clip
indicators, aggregation coefficients); the loss gradient is that divided by den.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp

from ibpo_jax.config.registry import AGGREGATIONS, KL_ESTIMATORS, LOSSES
from ibpo_jax.core.kl import LOG_RATIO_CLAMP, kl_k1, kl_k2, kl_k3, kl_low_var  # noqa: F401
from ibpo_jax.core.numerics import entropy, safe_div  # (safe_div also as losses.safe_div)


class LossSpec(Protocol):
    """The hyperparameters a loss reads, one frozen (hashable) dataclass; the config's `loss`
    section (`config.sections.LossConfig`: documented, checked) is one. No config import."""

    name: str  # registry.LOSSES
    aggregation: str  # registry.AGGREGATIONS
    clip_eps_low: float | str  # "auto": the loss's own (config.sections.CLIP_EPS)
    clip_eps_high: float | str
    beta: float  # KL coefficient
    kl_estimator: str  # registry.KL_ESTIMATORS
    norm_const: float
    value_coef: float  # PPO
    value_clip: float  # PPO
    kl_in: str  # "loss" or "reward"
    tis: str  # "none", "token" or "sequence"
    tis_cap: float
    tis_mode: str  # "truncate" or "mask"
    entropy_coef: float


class Stat(NamedTuple):
    """A metric as numerator and denominator, so micro-batches combine exactly."""

    num: jax.Array
    den: jax.Array


class LossOutput(NamedTuple):
    """loss = num / den. metrics: name -> Stat, except ratio_min / ratio_max (per-micro-batch
    scalars, +inf / -inf when empty; combine with min / max; see `combine_metrics`)."""

    num: jax.Array
    den: jax.Array
    metrics: dict
    weights: jax.Array | None = None  # [B, T] DESIGN §5 w_it (policy losses), stop-gradient


def combine_metrics(a: dict, b: dict) -> dict:
    """Merges the metrics of two micro-batches: Stats add, *_min / *_max take min / max."""
    out = {}
    for key, x in a.items():
        y = b[key]
        if isinstance(x, Stat):
            out[key] = Stat(x.num + y.num, x.den + y.den)
        elif key.endswith("_min"):
            out[key] = jnp.minimum(x, y)
        elif key.endswith("_max"):
            out[key] = jnp.maximum(x, y)
        else:
            raise ValueError(f"metric {key!r} is neither a Stat nor a *_min / *_max scalar")
    return out


def finalize_metrics(metrics: dict) -> dict[str, jax.Array]:
    """Scalars for logging: Stat -> num / den (0 when den == 0); other entries unchanged."""
    return {k: safe_div(*v) if isinstance(v, Stat) else v for k, v in metrics.items()}


# --------------------------------------------------------------------------- aggregations


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(mask: jax.Array, *, norm_const=None) -> tuple[jax.Array, jax.Array]:
    """GRPO / GSPO original: mean over sequences of the mean over their tokens: c_it = m_it /
    n_i, den = #sequences with n_i > 0 (c [B, T] float32, den scalar; no norm_const)."""
    m = mask.astype(jnp.float32)
    n = jnp.sum(m, axis=-1, keepdims=True)
    return m / jnp.maximum(n, 1.0), jnp.sum(n > 0).astype(jnp.float32)


@AGGREGATIONS.register("token_mean")
def token_mean(mask: jax.Array, *, norm_const=None) -> tuple[jax.Array, jax.Array]:
    """DAPO: mean over all valid tokens of the batch. c_it = m_it; den = #tokens."""
    m = mask.astype(jnp.float32)
    return m, jnp.sum(m)


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(mask: jax.Array, *, norm_const=None) -> tuple[jax.Array, jax.Array]:
    """Dr. GRPO: per-sequence token sums divided by a run constant (e.g. the max response length).

    c_it = m_it / norm_const; den = #sequences with a valid token.
    """
    if norm_const is None or (isinstance(norm_const, (int, float)) and norm_const <= 0):
        raise ValueError("aggregation 'seq_mean_token_sum_norm' needs norm_const > 0 (e.g. "
                         f"the max response length); got {norm_const}")
    m = mask.astype(jnp.float32)
    return m / norm_const, jnp.sum(jnp.any(m > 0, axis=-1)).astype(jnp.float32)


def coefficients(spec: LossSpec, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(c [B, T], den) of spec.aggregation for the valid tokens [B, T]."""
    agg = AGGREGATIONS.get(spec.aggregation, key="config.loss.aggregation")
    return agg(valid, norm_const=spec.norm_const or None)


def aggregate(spec: LossSpec, per_token: jax.Array, mask: jax.Array
              ) -> tuple[jax.Array, jax.Array]:
    """(num, den) of per-token values [B, T] under spec.aggregation; padding is ignored."""
    coeff, den = coefficients(spec, mask)
    return jnp.sum(coeff * jnp.where(mask.astype(bool), per_token, 0.0)), den


# --------------------------------------------------------------------------- KL estimators


def kl_penalty(spec: LossSpec, *, logp: jax.Array, ref_logp: jax.Array | None,
               mask: jax.Array) -> tuple[jax.Array, dict]:
    """β · aggregated per-token KL estimate (spec.beta, spec.kl_estimator), as a numerator
    sharing the policy loss's den (spec.aggregation).

    Returns (num scalar, metrics {"kl_loss", "kl"}); empty metrics and num 0 without ref_logp
    or when β·KL goes into the reward (spec.kl_in "reward": `kl_reward`).
    """
    if spec.kl_in != "loss":
        return jnp.zeros((), jnp.float32), {}
    if ref_logp is None:
        if spec.beta != 0:
            raise ValueError(f"beta={spec.beta} needs ref_logp (the reference policy's log-probs)")
        return jnp.zeros((), jnp.float32), {}
    logp = jnp.asarray(logp, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    if ref_logp.shape != logp.shape:
        raise ValueError(f"ref_logp {ref_logp.shape} must have logp's shape {logp.shape}")
    valid = jnp.asarray(mask).astype(bool)
    logp, ref_logp = jnp.where(valid, logp, 0.0), jnp.where(valid, ref_logp, 0.0)
    estimator = KL_ESTIMATORS.get(spec.kl_estimator, key="config.loss.kl_estimator")
    kl = jnp.where(valid, estimator(logp, ref_logp), 0.0)
    num, den = aggregate(spec, kl, valid)
    num = spec.beta * num
    sg = jax.lax.stop_gradient
    return num, {"kl_loss": Stat(sg(num), den),
                 "kl": Stat(sg(jnp.sum(kl)), jnp.sum(valid).astype(jnp.float32))}


def kl_reward(spec: LossSpec, *, sample_logp: jax.Array, ref_logp: jax.Array,
              mask: jax.Array) -> jax.Array:
    """β · Σ_t k(logπ_sampler, logπ_ref) per row [B] (spec.kl_estimator; no gradient): the
    penalty `loss.kl_in = "reward"` takes off each row's reward before the advantages. The
    tokens are the sampler's samples, so k1 is unbiased for the sequence KL(π_sampler ‖ π_ref)
    (ibpo_jax/core/kl.py's table). sample_logp, ref_logp, mask: [B, T]."""
    valid = jnp.asarray(mask).astype(bool)
    estimator = KL_ESTIMATORS.get(spec.kl_estimator, key="config.loss.kl_estimator")
    kl = estimator(jnp.where(valid, sample_logp, 0.0), jnp.where(valid, ref_logp, 0.0))
    return jax.lax.stop_gradient(spec.beta * jnp.sum(jnp.where(valid, kl, 0.0), axis=-1))


def entropy_bonus(spec: LossSpec, *, entropy: jax.Array, mask: jax.Array
                  ) -> tuple[jax.Array, dict]:
    """-spec.entropy_coef · Σ c_it H_it: the entropy bonus as a numerator sharing the policy
    loss's den (spec.aggregation). entropy: [B, T] per-token policy entropy (carries
    gradient); mask [B, T]. Returns (num, {"entropy_loss": Stat}); ∂num/∂H_it = -coef · c_it."""
    valid = jnp.asarray(mask).astype(bool)
    num, den = aggregate(spec, jnp.asarray(entropy, jnp.float32), valid)
    num = -spec.entropy_coef * num
    return num, {"entropy_loss": Stat(jax.lax.stop_gradient(num), den)}


def mismatch_kl(*, old_logp: jax.Array, sample_logp: jax.Array, mask: jax.Array) -> Stat:
    """Token-mean k3 estimate of KL(π_sampler ‖ π_old) on the sampled tokens (they are the
    sampler's samples), [B, T] inputs: the sampler-trainer mismatch (≥ 0, 0 iff equal)."""
    valid = jnp.asarray(mask).astype(bool)
    kl = kl_k3(jnp.where(valid, sample_logp, 0.0), jnp.where(valid, old_logp, 0.0))
    return Stat(jnp.sum(jnp.where(valid, kl, 0.0)), jnp.sum(valid).astype(jnp.float32))


def tis_weights(spec: LossSpec, *, old_logp: jax.Array, sample_logp: jax.Array,
                mask: jax.Array) -> tuple[jax.Array, Stat]:
    """Truncated importance sampling against the sampler-trainer mismatch (Yao et al. 2025,
    "Your efficient RL framework secretly brings you off-policy RL training"; DESIGN §4).

    r = π_old / π_sampler per token (spec.tis "token"), or per row the geometric mean
    exp(mean_t log r_t) on its tokens ("sequence": length-normalized like GSPO's ratio; the
    product would put long rows far past any cap from small per-token gaps). Weight:
    "truncate" min(r, C); "mask" r · 1[r <= C] (outliers dropped). C = spec.tis_cap.
    old_logp, sample_logp, mask: [B, T]. Returns (w [B, T] stop-gradient, 0 on padding;
    tis_capped_frac: the share of tokens whose ratio exceeds C)."""
    valid = jnp.asarray(mask).astype(bool)
    log_r = jnp.clip(jnp.where(valid, old_logp - sample_logp, 0.0), -LOG_RATIO_CLAMP,
                     LOG_RATIO_CLAMP)
    if spec.tis == "sequence":
        n = jnp.sum(valid, axis=-1, keepdims=True)
        log_r = jnp.broadcast_to(jnp.sum(log_r, -1, keepdims=True) / jnp.maximum(n, 1),
                                 log_r.shape)
    r = jnp.exp(log_r)
    over = valid & (r > spec.tis_cap)
    w = jnp.minimum(r, spec.tis_cap) if spec.tis_mode == "truncate" else jnp.where(over, 0.0, r)
    capped = Stat(jnp.sum(over).astype(jnp.float32), jnp.sum(valid).astype(jnp.float32))
    return jax.lax.stop_gradient(jnp.where(valid, w, 0.0)), capped


def entropy_stat(logits: jax.Array, mask: jax.Array) -> Stat:
    """Token-mean policy entropy from logits [B, T, V] (fp32 log-softmax), no gradient."""
    logits = jax.lax.stop_gradient(jnp.asarray(logits, jnp.float32))
    if logits.shape[:2] != jnp.shape(mask):
        raise ValueError(f"logits {logits.shape} must be mask's shape {jnp.shape(mask)} + [V]")
    ent = entropy(logits)  # [B, T]; masked vocabulary (-inf) contributes 0
    valid = jnp.asarray(mask).astype(bool)
    return Stat(jnp.sum(jnp.where(valid, ent, 0.0)), jnp.sum(valid).astype(jnp.float32))


# --------------------------------------------------------------------------- policy terms


class _Inputs(NamedTuple):
    """A loss's checked inputs: padding zeroed, log ratio clamped, aggregation coefficients."""

    logp: jax.Array  # [B, T] float32, 0 on padding (carries gradient)
    log_ratio: jax.Array  # [B, T] logπ_θ - logπ_old, 0 on padding, clamped
    adv: jax.Array  # [B] or [B, T] float32
    valid: jax.Array  # [B, T] bool
    coeff: jax.Array  # [B, T] aggregation coefficients c_it
    den: jax.Array  # scalar aggregation denominator
    tis: tuple[jax.Array, Stat] | None = None  # `tis_weights` (spec.tis != "none")


class _Terms(NamedTuple):
    loss: jax.Array  # [B, T] per-token ℓ (sequence losses broadcast), 0 on padding
    weight: jax.Array  # [B, T] w: ∂(Σ c ℓ)/∂logp_it = -A_it w_it
    ratio: jax.Array  # ratio per unit: [B, T] tokens or [B] sequences
    ratio_valid: jax.Array  # bool, ratio's shape
    clipped: jax.Array  # bool [B, T] or [B]: the clipped branch was taken
    clip_valid: jax.Array  # bool, clipped's shape


def token_adv(adv: jax.Array, valid: jax.Array) -> jax.Array:
    """[B] or [B, T] advantages as [B, T] (valid [B, T] bool), 0 where not valid (padding
    may hold anything)."""
    return jnp.where(valid, adv[:, None] if adv.ndim == 1 else adv, 0.0)


def _clipped_surrogate(ratio, adv, spec: LossSpec):
    """ℓ = -min(ρA, clip(ρ, 1-ε_low, 1+ε_high)A) and the clipped-branch indicator."""
    clipped_ratio = jnp.clip(ratio, 1.0 - spec.clip_eps_low, 1.0 + spec.clip_eps_high)
    take_clipped = jax.lax.stop_gradient(clipped_ratio * adv < ratio * adv)
    # Where the clipped branch wins, ρ is strictly outside the range, so that branch is flat.
    return -jnp.where(take_clipped, clipped_ratio * adv, ratio * adv), take_clipped


def _seq_log_ratio(x: _Inputs):
    n = jnp.sum(x.valid, axis=-1)
    mean = jnp.sum(x.log_ratio, axis=-1) / jnp.maximum(n, 1)
    return jnp.clip(mean, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), n


def _inputs(name: str, spec: LossSpec, logp, old_logp, adv, mask, ranks: tuple[int, ...],
            sample_logp=None) -> _Inputs:
    """Checks shapes (adv of rank in `ranks`: 1 = [B], 2 = [B, T]) and prepares the inputs."""
    logp = jnp.asarray(logp, jnp.float32)
    old_logp = jnp.asarray(old_logp, jnp.float32)
    adv = jnp.asarray(adv, jnp.float32)
    if logp.ndim != 2:
        raise ValueError(f"logp must be [B, T]; got shape {logp.shape}")
    for arg, x in (("old_logp", old_logp), ("mask", mask)):
        if jnp.shape(x) != logp.shape:
            raise ValueError(f"{arg} {jnp.shape(x)} must have logp's shape {logp.shape}")
    if adv.ndim not in ranks or adv.shape != logp.shape[: adv.ndim]:
        want = " or ".join(("[B]", "[B, T]")[r - 1] for r in ranks)
        hint = "; use 'gspo_token' for per-token advantages" if name == "gspo" else ""
        raise ValueError(f"loss {name!r} needs adv {want}; got {adv.shape}{hint}")
    valid = jnp.asarray(mask).astype(bool)
    # Padding may hold anything (-inf, NaN); zero it before any arithmetic so that neither values
    # nor gradients (0 · inf) can pick it up.
    logp = jnp.where(valid, logp, 0.0)
    log_ratio = jnp.clip(jnp.where(valid, logp - old_logp, 0.0), -LOG_RATIO_CLAMP,
                         LOG_RATIO_CLAMP)
    coeff, den = coefficients(spec, valid)
    tis = None
    if sample_logp is not None and spec.tis != "none":
        tis = tis_weights(spec, old_logp=old_logp, sample_logp=sample_logp, mask=valid)
    return _Inputs(logp, log_ratio, adv, valid, coeff, den, tis)


def _token_terms(x: _Inputs, spec: LossSpec) -> _Terms:
    """GRPO / PPO: per-token ratio ρ_it; w_it = c_it ρ_it 1[unclipped_it]."""
    ratio = jnp.exp(x.log_ratio)
    loss, clipped = _clipped_surrogate(ratio, token_adv(x.adv, x.valid), spec)
    weight = x.coeff * ratio * ~clipped
    return _Terms(jnp.where(x.valid, loss, 0.0), weight, ratio, x.valid, clipped & x.valid,
                  x.valid)


def _loss_output(spec: LossSpec, x: _Inputs, terms: _Terms, ref_logp, logits,
                 seq_level: bool = False) -> LossOutput:
    """num = Σ c ℓ + β·KL numerator, the metrics, and the token weights. With TIS (x.tis) each
    token's ℓ times its TIS weight τ: w_it τ_it, or for a sequence loss (ℓ_i on every token,
    `seq_level`) w_i Σ_t c_it τ_it / Σ_t c_it, the gradient reaching each token through ℓ_i."""
    weight, loss = terms.weight, terms.loss
    if x.tis is not None:
        tau = x.tis[0]
        loss = loss * tau
        weight = weight * (safe_div(jnp.sum(x.coeff * tau, -1, keepdims=True),
                                    jnp.sum(x.coeff, -1, keepdims=True)) if seq_level else tau)
    pg_num = jnp.sum(x.coeff * loss)
    kl_num, kl_metrics = kl_penalty(spec, logp=x.logp, ref_logp=ref_logp, mask=x.valid)
    sg = jax.lax.stop_gradient
    ratio, rv = sg(terms.ratio), terms.ratio_valid
    metrics = {
        "pg_loss": Stat(sg(pg_num), x.den),
        "clip_frac": Stat(jnp.sum(terms.clipped).astype(jnp.float32),
                          jnp.sum(terms.clip_valid).astype(jnp.float32)),
        "ratio_mean": Stat(jnp.sum(jnp.where(rv, ratio, 0.0)), jnp.sum(rv).astype(jnp.float32)),
        "ratio_min": jnp.min(jnp.where(rv, ratio, jnp.inf)),
        "ratio_max": jnp.max(jnp.where(rv, ratio, -jnp.inf)),
        **kl_metrics,
    }
    if x.tis is not None:
        metrics["tis_capped_frac"] = x.tis[1]
    if logits is not None:
        metrics["entropy"] = entropy_stat(logits, x.valid)
    return LossOutput(pg_num + kl_num, x.den, metrics, sg(weight))


# --------------------------------------------------------------------------- policy losses
# Every policy loss: fn(spec: LossSpec, *, logp, old_logp, adv, mask, ref_logp=None,
# logits=None, sample_logp=None) -> LossOutput.
#   logp: [B, T] log π_θ of the sampled tokens (the only input that carries gradient).
#   old_logp: [B, T] log π_old (behaviour policy). mask: [B, T] response tokens incl. EOS.
#   adv: advantages, [B] per sequence or [B, T] per token (each loss says which).
#   ref_logp: [B, T] log π_ref, needed when spec.beta != 0 (the KL term is aggregated like
#   the policy term, inside num). logits: optional [B, T, V], only for the entropy metric.
#   sample_logp: [B, T] the sampler's log-probs, for TIS (spec.tis; metric tis_capped_frac).
# LossOutput.metrics (no gradient): pg_loss, kl_loss (β-weighted; pg_loss + kl_loss = loss),
# kl (token mean of the estimator), clip_frac, ratio_mean as Stats; ratio_min / ratio_max per
# micro-batch; entropy when logits are given. LossOutput.weights: DESIGN §5's w_it.


@LOSSES.register("grpo")
def grpo_loss(spec: LossSpec, *, logp: jax.Array, old_logp: jax.Array, adv: jax.Array,
              mask: jax.Array, ref_logp: jax.Array | None = None,
              logits: jax.Array | None = None, sample_logp: jax.Array | None = None
              ) -> LossOutput:
    """GRPO clipped surrogate (Shao et al. 2024, eq. 3; paper §3.4; DESIGN §4), per token:
    ℓ_it = -min(ρ_it A_it, clip(ρ_it, 1-ε_low, 1+ε_high) A_it), ε = 0.2.

    adv [B] (broadcast over tokens) or [B, T] (token-level IBPO credit). clip_frac and the
    ratio metrics are over tokens.
    """
    x = _inputs("grpo", spec, logp, old_logp, adv, mask, ranks=(1, 2),
                sample_logp=sample_logp)
    return _loss_output(spec, x, _token_terms(x, spec), ref_logp, logits)


@LOSSES.register("ppo")
def ppo_loss(spec: LossSpec, *, logp: jax.Array, old_logp: jax.Array, adv: jax.Array,
             mask: jax.Array, ref_logp: jax.Array | None = None,
             logits: jax.Array | None = None, sample_logp: jax.Array | None = None
             ) -> LossOutput:
    """PPO clipped policy loss (Schulman et al. 2017, eq. 7 L^CLIP; DESIGN §4): GRPO's
    per-token surrogate with per-token advantages from `advantages.ppo_advantages`, so adv
    must be [B, T]. The value head is trained with `value_loss`, added by the trainer with
    spec.value_coef.
    """
    x = _inputs("ppo", spec, logp, old_logp, adv, mask, ranks=(2,),
                sample_logp=sample_logp)
    return _loss_output(spec, x, _token_terms(x, spec), ref_logp, logits)


@LOSSES.register("gspo")
def gspo_loss(spec: LossSpec, *, logp: jax.Array, old_logp: jax.Array, adv: jax.Array,
              mask: jax.Array, ref_logp: jax.Array | None = None,
              logits: jax.Array | None = None, sample_logp: jax.Array | None = None
              ) -> LossOutput:
    """GSPO (Zheng et al. 2025, the sequence-level objective; paper §3.4; DESIGN §4):
    s_i = exp(mean_t log ρ_it) over the valid tokens, ℓ_i = -min(s_i A_i, clip(s_i, 1-3e-4,
    1+4e-4) A_i), placed on every valid token before aggregation (seq_mean_token_mean gives
    mean_i ℓ_i). adv must be [B]. clip_frac and the ratio metrics are over sequences.

    w: ∂(Σ_t c_it ℓ_i)/∂logp_it = -A_i (Σ_t' c_it') s_i 1[unclipped_i] / n_i.
    """
    x = _inputs("gspo", spec, logp, old_logp, adv, mask, ranks=(1,),
                sample_logp=sample_logp)
    seq_lr, n = _seq_log_ratio(x)
    s = jnp.exp(seq_lr)
    loss, clipped = _clipped_surrogate(s, x.adv, spec)
    has = n > 0
    w_seq = jnp.sum(x.coeff, axis=-1) * s * ~clipped / jnp.maximum(n, 1)
    terms = _Terms(jnp.where(x.valid, loss[:, None], 0.0),
                   jnp.where(x.valid, w_seq[:, None], 0.0), s, has, clipped & has, has)
    return _loss_output(spec, x, terms, ref_logp, logits, seq_level=True)


@LOSSES.register("gspo_token")
def gspo_token_loss(spec: LossSpec, *, logp: jax.Array, old_logp: jax.Array, adv: jax.Array,
                    mask: jax.Array, ref_logp: jax.Array | None = None,
                    logits: jax.Array | None = None, sample_logp: jax.Array | None = None
              ) -> LossOutput:
    """GSPO-token (Zheng et al. 2025, the token-level variant; DESIGN §4) for token credit:
    s_it = sg[s_i] · exp(logπ_θ,it - sg[logπ_θ,it]) (value s_i, gradient s_i ∇logπ_θ,it),
    ℓ_it = -min(s_it A_it, clip(s_it, 1-3e-4, 1+4e-4) A_it); w_it = c_it s_i 1[unclipped_it].

    adv [B] or [B, T]; with per-sequence advantages it equals GSPO in value and gradient.
    clip_frac is over tokens, the ratio metrics over sequences (ratio = s_i).
    """
    x = _inputs("gspo_token", spec, logp, old_logp, adv, mask, ranks=(1, 2),
                sample_logp=sample_logp)
    seq_lr, n = _seq_log_ratio(x)
    s = jax.lax.stop_gradient(jnp.exp(seq_lr))
    s_tok = s[:, None] * jnp.exp(x.logp - jax.lax.stop_gradient(x.logp))
    loss, clipped = _clipped_surrogate(s_tok, token_adv(x.adv, x.valid), spec)
    terms = _Terms(jnp.where(x.valid, loss, 0.0), x.coeff * s[:, None] * ~clipped, s, n > 0,
                   clipped & x.valid, x.valid)
    return _loss_output(spec, x, terms, ref_logp, logits)


def token_weights(spec: LossSpec, *, logp: jax.Array, old_logp: jax.Array, adv: jax.Array,
                  mask: jax.Array) -> jax.Array:
    """The weights w_it of DESIGN §5 for loss `spec.name`: ∂num_pg/∂logp_it = -A_it · w_it.

    Everything in the policy gradient except the advantage: ratio factor, clip indicator and
    aggregation coefficient (the loss gradient is that over den); not the KL part. The
    identity is exact except on a token whose |log ratio| exceeds LOG_RATIO_CLAMP, where the
    clamp cuts the gradient. (A loss's own `LossOutput.weights` are the same.)

    Returns:
      w: [B, T] float32, stop-gradient, 0 on padding.
    """
    no_kl = dataclasses.replace(spec, beta=0.0)
    return LOSSES.get(spec.name, key="loss")(no_kl, logp=logp, old_logp=old_logp, adv=adv,
                                             mask=mask).weights


def value_loss(spec: LossSpec, *, values: jax.Array, old_values: jax.Array, returns: jax.Array,
               mask: jax.Array) -> LossOutput:
    """Clipped value loss for PPO's value head (DESIGN §4).

    v_clip = V_old + clip(V - V_old, -ε_v, ε_v);  ℓ_t = ½ max((V - R)², (v_clip - R)²).
    The max is the pessimistic choice of PPO2 / verl: a step that moves the value head more than
    ε_v away from V_old gets no gradient when that increases the error. The ½ makes ∂ℓ/∂V =
    (V - R) on the unclipped branch.

    Args:
      values: [B, T] current value predictions (carry gradient); old_values: [B, T] at rollout;
      returns: [B, T] GAE returns; mask: [B, T]. spec: ε_v = spec.value_clip (reward units),
      aggregated with spec.aggregation like the policy loss.

    Returns:
      LossOutput(num, den, {"vf_loss": Stat, "vf_clip_frac": Stat over tokens}).
    """
    values = jnp.asarray(values, jnp.float32)
    for arg, x in (("old_values", old_values), ("returns", returns), ("mask", mask)):
        if jnp.shape(x) != values.shape or values.ndim != 2:
            raise ValueError(f"{arg} {jnp.shape(x)} must match values' [B, T] {values.shape}")
    returns = jax.lax.stop_gradient(jnp.asarray(returns, jnp.float32))
    old_values = jax.lax.stop_gradient(jnp.asarray(old_values, jnp.float32))
    eps = spec.value_clip
    v_clip = old_values + jnp.clip(values - old_values, -eps, eps)
    err, err_clip = jnp.square(values - returns), jnp.square(v_clip - returns)
    take_clipped = jax.lax.stop_gradient(err_clip > err)
    per_token = 0.5 * jnp.where(take_clipped, err_clip, err)
    valid = jnp.asarray(mask).astype(bool)
    num, den = aggregate(spec, per_token, valid)
    n_tok = jnp.sum(valid).astype(jnp.float32)
    return LossOutput(num, den, {
        "vf_loss": Stat(jax.lax.stop_gradient(num), den),
        "vf_clip_frac": Stat(jnp.sum(take_clipped & valid).astype(jnp.float32), n_tok),
    })
