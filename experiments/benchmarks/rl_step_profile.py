"""`bench_rl_step.py --profile`: our update broken down at the last step's shapes.

Its log-prob passes, forward + backward, optimizer and one layer's attention, each jitted alone
(its model rows in the trainer's layout), timed best of 3 with XLA's cost analysis (FLOPs,
bytes); "update_other" = whole update - its parts (negative when the fused update is cheaper
than the parts run alone).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from bench_model import best_time  # a sibling script (bench_rl_step puts its folder on the path)

from ibpo_jax import models
from ibpo_jax.models import attention
from ibpo_jax.trainer import packing
from ibpo_jax.trainer.loop import Trainer


def update_parts(trainer: Trainer, state, rollout, plan) -> tuple[dict, list[int]]:
    """The update's parts as name -> (function, its arguments), and the attention's
    [rows, queries, keys]."""
    c, o, g = trainer.parts.base.config, trainer.parts.base.options, trainer.parts.spec.group_size
    grouped = trainer.parts.spec.layout == "grouped"
    if grouped:
        mask = jnp.arange(rollout.response.shape[1])[None] < rollout.response_len[:, None]
        p, r = rollout.prompt.shape[1], rollout.response.shape[1]
        n, t, s = rollout.response.shape[0], r, p + r  # the responses' attention
        prompt_mask = jnp.arange(p)[None] >= (p - rollout.prompt_len)[:, None]
        attn_mask = attention.grouped_mask(prompt_mask[::g], g, r)
    else:
        tokens, segments, _ = packing.pack(plan, rollout.prompt, rollout.prompt_len,
                                           rollout.response, rollout.response_len)
        (n, t), s = tokens.shape, tokens.shape[1]
        attn_mask = attention.causal_mask(segments > 0, segments)

    def logp(prm, entropy):
        if grouped:
            out = models.response_logprobs(c, o, prm, rollout.prompt[::g],
                                           rollout.prompt_len[::g], rollout.response,
                                           return_entropy=entropy)
            return out._replace(logprobs=jnp.where(mask, out.logprobs, 0.0))
        return models.token_logprobs(c, o, prm, tokens, segment_ids=segments,
                                     return_entropy=entropy)

    def masked_sum(prm):
        return jnp.sum(logp(prm, False).logprobs)  # 0 at padding and each row's first token

    def opt_step(prm, opt_state, grads):
        upd, opt_state = trainer.parts.optimizer.update(grads, opt_state, prm)
        return jax.tree.map(jnp.add, prm, upd), opt_state

    # One layer's attention at the same shapes (q [N, K, G, T, H], k/v [N, K, S, H]).
    kq = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq[0], (n, c.num_key_value_heads, c.num_groups, t, c.head_dim))
    k, v = (jax.random.normal(kk, (n, c.num_key_value_heads, s, c.head_dim)) for kk in kq[1:])
    def attend(q, k, v):  # the kernel the model config picks (model.attention)
        return attention.self_attention(q, k, v, attn_mask, o.attention)

    def attn_sum(q, k, v):
        return jnp.sum(attend(q, k, v))

    return {
        "logprob_pass_with_entropy": (lambda prm: logp(prm, True), (state.params,)),
        "logprob_pass": (lambda prm: logp(prm, False), (state.params,)),
        "fwd_bwd": (jax.grad(masked_sum), (state.params,)),
        "optimizer": (opt_step, (state.params, state.opt_state, state.params)),
        "attention_one_layer_fwd": (attend, (q, k, v)),
        "attention_one_layer_fwd_bwd": (jax.grad(attn_sum, argnums=(0, 1, 2)), (q, k, v)),
    }, [n, t, s]


def profile_update(trainer: Trainer, update, state, ref_params, rollout, cred, key,
                   plan) -> dict:
    """Our update's parts at the last step's shapes (its model rows in the trainer's layout),
    each jitted alone (best of 3, seconds), with XLA's cost analysis of each."""
    parts, shape = update_parts(trainer, state, rollout, plan)
    out, cost = {}, {}
    with jax.set_mesh(trainer.parts.mesh):
        for name, (fn, fn_args) in parts.items():
            compiled = jax.jit(fn).lower(*fn_args).compile()
            ca = compiled.cost_analysis()
            ca = ca[0] if isinstance(ca, list) else ca
            cost[name] = {"gflop": ca.get("flops", 0.0) / 1e9,
                          "gbytes_accessed": ca.get("bytes accessed", 0.0) / 1e9}
            jax.block_until_ready(compiled(*fn_args))
            out[name] = best_time(lambda: jax.block_until_ready(compiled(*fn_args)), 3, 1)

        def whole():
            jax.block_until_ready(update(jax.tree.map(jnp.copy, state), ref_params, rollout,
                                         cred, key, plan))

        whole()
        out["update_total"] = best_time(whole, 3, 1)
    # The update's own parts: a separate old pass (with entropy) only with several updates.
    own = ("logprob_pass", "fwd_bwd", "optimizer") + (
        () if trainer.parts.spec.single_update else ("logprob_pass_with_entropy",))
    out["update_other"] = out["update_total"] - sum(out[k] for k in own)
    out["xla_cost_analysis"] = cost
    out["layout"] = trainer.parts.spec.layout
    out["attention_rows_queries_keys"] = shape
    return out
