"""Sampling strategies, logits -> one token per row and its log-prob: greedy, or categorical
over softmax(logits / temperature) after top-k / top-p filters, drawn by inverse CDF from one
uniform per row (`sampling` draws row i's uniform whatever rows are active). The log-prob is
that of the distribution sampled from (renormalized over the filtered set)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class TopK:
    """Keeps the k largest logits of each row (ties at the k-th value kept too)."""

    k: int

    def __call__(self, logits: Array) -> Array:
        kth = jax.lax.top_k(logits, self.k)[0][..., -1:]
        return jnp.where(logits >= kth, logits, -jnp.inf)


@dataclasses.dataclass(frozen=True)
class TopP:
    """Nucleus filter: keeps the most probable tokens whose cumulative probability, counted
    before each token, is below p (so the top token always stays)."""

    p: float

    def __call__(self, logits: Array) -> Array:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        n_keep = jnp.sum(mass_before < self.p, axis=-1, keepdims=True)
        threshold = jnp.take_along_axis(sorted_logits, n_keep - 1, axis=-1)
        return jnp.where(logits >= threshold, logits, -jnp.inf)


@dataclasses.dataclass(frozen=True)
class Greedy:
    """argmax; log-probs of the untempered model distribution."""

    def __call__(self, logits: Array, rng: Array) -> tuple[Array, Array]:
        del rng
        tokens = jnp.argmax(logits, axis=-1)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]


_BLOCK = 128  # vocabulary block of the two-level inverse-CDF sampler


def sample_inverse_cdf(x: Array, rng: Array) -> tuple[Array, Array]:
    """Samples one token per row from softmax(x) ([B, V] float32, -inf allowed) and returns
    (tokens [B], log-probs [B]).

    Inverse-CDF with one uniform per row, in two levels (a block of `_BLOCK` tokens from the
    block masses, then a token inside it): exact up to float32 rounding of the partial sums,
    and on CPU ~10x cheaper than Gumbel-max, which needs V random numbers per row.
    """
    return inverse_cdf(x, jax.random.uniform(rng, (x.shape[0], 1)))


def inverse_cdf(x: Array, uniform: Array) -> tuple[Array, Array]:
    """The token where the cumulative probability of softmax(x) first reaches 1 - uniform:
    x [B, V], uniform [B, 1] in [0, 1). Never returns a zero-mass token, even where the float32
    partial sums of the two levels disagree by rounding."""
    b, v = x.shape
    n = -(-v // _BLOCK)
    top = jnp.max(x, axis=-1, keepdims=True)
    p = jnp.pad(jnp.exp(x - top), ((0, 0), (0, n * _BLOCK - v))).reshape(b, n, _BLOCK)
    block_mass = jnp.sum(p, axis=-1)  # [B, n]
    block_cdf = jnp.cumsum(block_mass, axis=-1)
    total = block_cdf[:, -1:]
    u = (1.0 - uniform) * total  # in (0, total]
    # u > 0 skips leading zero-mass blocks; a block whose cdf rises has mass > 0.
    blk = jnp.minimum(jnp.sum(block_cdf < u, axis=-1), n - 1)  # [B]
    before = (jnp.take_along_axis(block_cdf, blk[:, None], axis=1)
              - jnp.take_along_axis(block_mass, blk[:, None], axis=1))
    row_cdf = jnp.cumsum(jnp.take_along_axis(p, blk[:, None, None], axis=1)[:, 0], axis=-1)
    # Clipped into (0, block mass]: `before` can exceed the previous block's cdf by rounding,
    # and u - before <= 0 would pick the block's first token whatever its mass.
    u_in = jnp.clip(u - before, jnp.finfo(jnp.float32).tiny, row_cdf[:, -1:])
    within = jnp.minimum(jnp.sum(row_cdf < u_in, axis=-1), _BLOCK - 1)
    tokens = blk * _BLOCK + within
    logp = (jnp.take_along_axis(x, tokens[:, None], axis=-1) - top - jnp.log(total))[:, 0]
    return tokens, logp


@dataclasses.dataclass(frozen=True)
class Categorical:
    """Samples from softmax(filters(logits / temperature))."""

    temperature: float
    filters: tuple[Callable[[Array], Array], ...] = ()

    def __call__(self, logits: Array, rng: Array) -> tuple[Array, Array]:
        return self.sample(logits, jax.random.uniform(rng, (logits.shape[0], 1)))

    def sample(self, logits: Array, uniform: Array) -> tuple[Array, Array]:
        """logits [B, V], uniform [B, 1] in [0, 1) -> (tokens [B], log-probs [B])."""
        x = logits / self.temperature
        for f in self.filters:
            x = f(x)
        return inverse_cdf(x, uniform)


def make_strategy(*, temperature: float, top_k: int = 0, top_p: float = 1.0
                  ) -> Greedy | Categorical:
    """temperature 0 -> Greedy; else Categorical with TopK (k > 0) and TopP (p < 1)."""
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if isinstance(top_k, bool) or int(top_k) != top_k or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 = off), got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature == 0:
        return Greedy()
    filters = ((TopK(int(top_k)),) if top_k else ()) + ((TopP(float(top_p)),) if top_p < 1 else ())
    return Categorical(float(temperature), filters)
