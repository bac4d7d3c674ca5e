"""Numeric helpers every layer may use: a leaf module that imports only jax, so the comparison
kernel and the advantage estimators need nothing from the config or the losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
    """num / den, and 0 where den == 0 (no NaN in values or gradients)."""
    ok = den != 0
    return jnp.where(ok, num / jnp.where(ok, den, 1), 0.0)


def entropy(logits: jax.Array) -> jax.Array:
    """[...] entropy of softmax(logits) over the last axis (float32): -Σ p log p, with -inf
    logits (masked vocabulary) contributing 0."""
    p = jnp.exp(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1))
    return jnp.sum(jax.scipy.special.entr(p), axis=-1)
