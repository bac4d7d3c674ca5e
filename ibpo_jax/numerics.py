"""Numeric helpers every layer may use: a leaf module that imports only jax, so the comparison
kernel and the advantage estimators need nothing from the config or the losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
    """num / den, and 0 where den == 0 (no NaN in values or gradients)."""
    ok = den != 0
    return jnp.where(ok, num / jnp.where(ok, den, 1), 0.0)
