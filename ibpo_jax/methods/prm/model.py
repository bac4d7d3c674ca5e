"""The process reward model (PRM) of the PRM+GSPO baseline (DESIGN §7).

A PRM scores every step prefix of a response with the probability that it still leads to the
right answer; the process reward of a response is the minimum over its steps, and the baseline
shapes the outcome reward as r̃_i = R_i + λ_prm · min_k PRM_ik (DESIGN §7).

Our choice (DESIGN §7 asks to say which): the PRM is a separate, frozen copy of the base
policy's backbone with a trainable scalar head on the final normed hidden state (`final_hidden`)
at each step-end token. The head (linear, or one GELU layer of `width` units) is trained once,
before RL, with binary cross-entropy on soft Monte-Carlo labels (the fraction of N completions
from the step prefix that reach the right answer, `methods.prm.labels`, whose sampled
completions count in the rollout budget), and is not refreshed during RL. Only the head is
trained: the backbone's features are computed once (`features`), so fitting is a small
full-batch problem (`fit_head`).

Steps (DESIGN §2): a step ends at a delimiter token (`is_delim`, e.g. "\\n" for the char
tokenizer), and the response's last token ends the last step when it is not a delimiter
(an EOS, or the cut of a truncated response), so the last step end sees the whole response.
With the char tokenizer of `arith`, step k is line k of `arith.check` (a response ending in
"\\n" then EOS gets one extra step, the EOS alone). At most `max_steps` = K step ends are kept
per response: the FIRST K (a longer response is scored on its first K steps only, and its
whole-response step is then missing).

Shapes: N responses, P prompt columns (left-padded), R response columns (right-padded),
K step slots, D hidden size. All functions are pure and jittable unless said otherwise
(config, options and max_steps static).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from ibpo_jax.core.numerics import safe_div
from ibpo_jax.models.config import ModelOptions, Qwen3Config
from ibpo_jax.models.lm import final_hidden

Array = jax.Array
Head = dict[str, Array]
_STATS = ("shift", "scale")  # the head's feature standardization, set from data, not trained


def step_ends(response: Array, response_len: Array, is_delim: Array, *,
              max_steps: int) -> tuple[Array, Array]:
    """Positions of the tokens that end each step, the first `max_steps` of each response.

    response [N, R] int, response_len [N] int (EOS included when there is one), is_delim [V]
    bool. Returns (pos [N, K] int32 response columns, valid [N, K] bool); pos is 0 where not
    valid. A step ends at each delimiter and at the last token when that is not a delimiter;
    an empty response has no step.
    """
    response = jnp.asarray(response)
    width = response.shape[1]
    length = jnp.clip(jnp.asarray(response_len), 0, width)
    col = jnp.arange(width)[None, :]
    delim = jnp.take(jnp.asarray(is_delim), response, mode="clip")  # [N, R]
    ends = (col < length[:, None]) & (delim | (col == length[:, None] - 1))
    pos = jax.vmap(lambda e: jnp.nonzero(e, size=max_steps, fill_value=0)[0])(ends)
    valid = jnp.arange(max_steps)[None, :] < jnp.sum(ends, axis=-1)[:, None]
    return pos.astype(jnp.int32), valid


# ---------------------------------------------------------------------------------------------
# The scalar head


def init_head(key: Array, hidden_size: int, *, width: int = 0) -> Head:
    """A head on features [..., D]: linear (width 0) or one GELU layer of `width` units.

    The output layer starts at 0 (every step scored 0.5). shift / scale standardize each
    feature dimension (identity here; `fit_head` sets them from the training features): a real
    backbone's hidden states have a few dimensions far larger than the rest, which would
    otherwise dominate the head's first steps.
    """
    head = {"shift": jnp.zeros(hidden_size, jnp.float32),
            "scale": jnp.ones(hidden_size, jnp.float32), "b": jnp.zeros((), jnp.float32)}
    if width <= 0:
        return head | {"w": jnp.zeros(hidden_size, jnp.float32)}
    w1 = jax.random.normal(key, (hidden_size, width), jnp.float32) / jnp.sqrt(hidden_size)
    return head | {"w1": w1, "b1": jnp.zeros(width, jnp.float32),
                   "w2": jnp.zeros(width, jnp.float32)}


def head_apply(head: Head, feats: Array) -> Array:
    """feats [..., D] -> logits [...] float32 (the PRM's score is their sigmoid)."""
    x = (jnp.asarray(feats, jnp.float32) - head["shift"]) / head["scale"]
    if "w1" in head:
        return jax.nn.gelu(x @ head["w1"] + head["b1"]) @ head["w2"] + head["b"]
    return x @ head["w"] + head["b"]


def bce_loss(head: Head, feats: Array, labels: Array, valid: Array) -> Array:
    """Mean binary cross-entropy over the valid steps: feats [N, K, D], soft labels [N, K] in
    [0, 1], valid [N, K] bool -> scalar float32 (0 when nothing is valid). With soft labels its
    minimum is the labels' mean entropy, not 0."""
    z = head_apply(head, feats)
    y = jnp.asarray(labels, jnp.float32)
    per_step = jnp.logaddexp(0.0, z) - y * z  # -[y log σ(z) + (1 - y) log(1 - σ(z))]
    w = jnp.asarray(valid, jnp.float32)
    return safe_div(jnp.sum(per_step * w), jnp.sum(w))


@functools.partial(jax.jit, static_argnames=("steps", "lr"))
def _fit(head: Head, feats: Array, labels: Array, valid: Array, *, steps: int, lr: float
         ) -> tuple[Head, Array]:
    """`steps` full-batch adam steps on the head's trainable leaves; returns the head and the
    loss before each step [steps]."""
    stats = {k: head[k] for k in _STATS}
    params = {k: v for k, v in head.items() if k not in _STATS}
    opt = optax.adam(lr)

    def body(carry, _):
        p, state = carry
        loss, grads = jax.value_and_grad(lambda q: bce_loss(stats | q, feats, labels, valid))(p)
        updates, state = opt.update(grads, state, p)
        return (optax.apply_updates(p, updates), state), loss

    (params, _), losses = jax.lax.scan(body, (params, opt.init(params)), None, length=steps)
    return stats | params, losses


def fit_head(key: Array, feats: Array, labels: Array, valid: Array, *, steps: int = 500,
             lr: float = 1e-2, width: int = 0) -> tuple[Head, dict[str, float]]:
    """Trains a fresh head on precomputed features (full batch, adam, one jitted scan).

    feats [N, K, D] (`features`), labels [N, K] soft in [0, 1], valid [N, K]. Host function.
    Metrics: loss_init / loss (BCE before / after), loss_floor (the labels' mean entropy, the
    best BCE reachable), accuracy ((σ > 0.5) == (label > 0.5) over valid steps), steps (valid
    step count).
    """
    feats = jnp.asarray(feats, jnp.float32)
    labels = jnp.asarray(labels, jnp.float32)
    valid = jnp.asarray(valid, bool)
    w = valid.astype(jnp.float32)[..., None]
    n = jnp.maximum(jnp.sum(w), 1.0)
    mean = jnp.sum(feats * w, axis=(0, 1)) / n
    var = jnp.sum(jnp.square(feats - mean) * w, axis=(0, 1)) / n
    head = init_head(key, feats.shape[-1], width=width) | {"shift": mean,
                                                           "scale": jnp.sqrt(var + 1e-6)}
    head, losses = _fit(head, feats, labels, valid, steps=int(steps), lr=float(lr))
    y = jnp.clip(labels, 1e-7, 1 - 1e-7)
    entropy = -(y * jnp.log(y) + (1 - y) * jnp.log1p(-y))
    hit = (head_apply(head, feats) > 0) == (labels > 0.5)
    metrics = {"loss_init": losses[0] if steps else bce_loss(head, feats, labels, valid),
               "loss": bce_loss(head, feats, labels, valid),
               "loss_floor": safe_div(jnp.sum(entropy * w[..., 0]), jnp.sum(w)),
               "accuracy": safe_div(jnp.sum(hit * w[..., 0]), jnp.sum(w)),
               "steps": jnp.sum(w)}
    return head, {k: float(v) for k, v in metrics.items()}


# ---------------------------------------------------------------------------------------------
# Scoring responses


def features(config: Qwen3Config, options: ModelOptions, backbone_params: Any, prompt: Array,
             prompt_len: Array, response: Array, response_len: Array, pos: Array) -> Array:
    """The backbone's final normed hidden state at each step end: [N, K, D] float32.

    prompt [N, P] left-padded to prompt_len [N], response [N, R] right-padded to response_len
    [N], pos [N, K] response columns (`step_ends`). Runs the model on prompt + response
    concatenated (the response starts at column P); padding takes no position, so the result
    does not depend on the padding. Entries at invalid steps are finite but meaningless.
    """
    p, r = prompt.shape[1], response.shape[1]
    tokens = jnp.concatenate([prompt, response], axis=1).astype(jnp.int32)  # [N, P + R]
    mask = jnp.concatenate([jnp.arange(p)[None, :] >= (p - prompt_len)[:, None],
                            jnp.arange(r)[None, :] < response_len[:, None]], axis=1)
    hidden = final_hidden(config, options, backbone_params, tokens, mask)  # [N, P + R, D]
    return jnp.take_along_axis(hidden, (p + pos)[..., None], axis=1)


def step_probs(config: Qwen3Config, options: ModelOptions, backbone_params: Any, head: Head,
               prompt: Array, prompt_len: Array, response: Array, response_len: Array,
               is_delim: Array, *, max_steps: int) -> tuple[Array, Array]:
    """The PRM's score σ(head(feature)) of each step prefix: (prob [N, K] float32, 0 where not
    valid; valid [N, K] bool). Arguments as in `process_reward`."""
    pos, valid = step_ends(response, response_len, is_delim, max_steps=max_steps)
    feats = features(config, options, backbone_params, prompt, prompt_len, response,
                     response_len, pos)
    return jnp.where(valid, jax.nn.sigmoid(head_apply(head, feats)), 0.0), valid


def process_reward(config: Qwen3Config, options: ModelOptions, backbone_params: Any, head: Head,
                   prompt: Array, prompt_len: Array, response: Array, response_len: Array,
                   is_delim: Array, *, max_steps: int) -> Array:
    """min_k PRM_ik over the valid steps of each response (DESIGN §7): [N] float32 in [0, 1];
    0 for a response with no step (empty). The shaping r̃ = R + λ_prm · this is the caller's.

    prompt [N, P] left-padded to prompt_len [N], response [N, R] right-padded to response_len
    [N] (EOS included), is_delim [V] bool; config, options and max_steps are static under jit.
    """
    prob, valid = step_probs(config, options, backbone_params, head, prompt, prompt_len,
                             response, response_len, is_delim, max_steps=max_steps)
    return min_over_steps(prob, valid)


def min_over_steps(prob: Array, valid: Array) -> Array:
    """min_k prob[i, k] over the valid steps [N, K] -> [N]; 0 for a row with no step."""
    lowest = jnp.min(jnp.where(valid, prob, 1.0), axis=-1)
    return jnp.where(jnp.any(valid, axis=-1), lowest, 0.0)


def label_agreement(prob: Array, valid: Array, first_wrong: Array) -> tuple[int, int]:
    """(hits, valid prefixes) behind `label_accuracy`: counts, so that processes holding
    different rows can sum them. Host function."""
    prob, valid, first_wrong = (jnp.asarray(x) for x in (prob, valid, first_wrong))
    k = jnp.arange(prob.shape[1])[None, :]
    clean = (first_wrong[:, None] < 0) | (k < first_wrong[:, None])
    return int(jnp.sum(((prob > 0.5) == clean) & valid)), int(jnp.sum(valid))


def label_accuracy(prob: Array, valid: Array, first_wrong: Array) -> float:
    """Agreement of step scores with the true first error (`arith.check`'s first_wrong_step).

    prob [N, K], valid [N, K], first_wrong [N] int (-1 = no wrong step). The fraction of valid
    step prefixes where (prob > 0.5) == (prefix k has no error yet: first_wrong == -1 or
    k < first_wrong); nan when no step is valid. Host function.
    """
    hits, n = label_agreement(prob, valid, first_wrong)
    return hits / n if n else float("nan")


__all__ = ["Head", "bce_loss", "features", "fit_head", "head_apply", "init_head",
           "label_accuracy", "label_agreement", "process_reward", "step_ends", "step_probs"]
