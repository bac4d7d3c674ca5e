"""FLOPs and matmul bytes of a traced program, loop-aware, and DESIGN §9's analytic model.

XLA's `compiled.cost_analysis()` counts the body of every while loop once (measured here: a
10-step `lax.scan` of a matmul reports one matmul's FLOPs), and every loop of an RL step matters:
the scan over layers (`scan_layers`), over micro-batches, over logit chunks. So the plan counts
FLOPs on the jaxpr, where each `scan` knows its length: `dot_general` FLOPs (2 · batch · M · N ·
K), multiplied by the trip counts of the scans around them, recursing into every sub-jaxpr
(jit, remat, custom VJP, cond: its costliest branch). A `while_loop` counts its body once: the
decode segment's loop is one decode step per trip, which the plan multiplies by the steps
itself. Elementwise work (softmax, norms, the optimizer) is left out: next to the matmuls of a
billion-parameter model it is well under 1 % of the FLOPs. The bytes are those of the matmuls'
operands and results (global shapes), the roofline's memory side for compute-heavy programs;
the decode step's bytes come from `decode_bytes` instead (weights + filled KV cache).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass
class Count:
    flops: float = 0.0
    bytes: float = 0.0  # operands + results of the matmuls

    def add(self, other: Count, times: float = 1.0) -> None:
        self.flops += times * other.flops
        self.bytes += times * other.bytes


def _nbytes(aval: Any) -> float:
    return math.prod(aval.shape) * np.dtype(aval.dtype).itemsize


def _dot_flops(eqn: Any) -> float:
    lhs, rhs = (v.aval for v in eqn.invars)
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    contract = math.prod(lhs.shape[d] for d in lc)
    batch = math.prod(lhs.shape[d] for d in lb)
    m = math.prod(s for d, s in enumerate(lhs.shape) if d not in lc and d not in lb)
    n = math.prod(s for d, s in enumerate(rhs.shape) if d not in rc and d not in rb)
    return 2.0 * batch * m * n * contract


def _subjaxprs(eqn: Any):
    for value in eqn.params.values():
        for v in (value if isinstance(value, (tuple, list)) else (value,)):
            if isinstance(v, jax.extend.core.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jax.extend.core.Jaxpr):
                yield v


def count_jaxpr(jaxpr: Any) -> Count:
    """Matmul FLOPs and bytes of `jaxpr` (a Jaxpr or ClosedJaxpr), scans times their length."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = Count()
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total.add(Count(_dot_flops(eqn), sum(_nbytes(v.aval) for v in eqn.invars)
                            + sum(_nbytes(v.aval) for v in eqn.outvars)))
            continue
        subs = [count_jaxpr(j) for j in _subjaxprs(eqn)]
        if not subs:
            continue
        if name == "cond":
            total.add(max(subs, key=lambda c: c.flops))
        elif name == "scan":
            for c in subs:
                total.add(c, eqn.params["length"])
        elif name == "while":  # cond + body once: one trip
            for c in subs:
                total.add(c)
        elif name in ("custom_vjp_call", "custom_jvp_call"):
            total.add(subs[0])  # the primal function; the rule's jaxprs are not both run
        else:
            for c in subs:
                total.add(c)
    return total


def count_traced(traced: Any) -> Count:
    """`count_jaxpr` of a `jax.jit(f).trace(...)` result."""
    return count_jaxpr(traced.jaxpr)


# ------------------------------------------------------------------ DESIGN §9, analytic


@dataclasses.dataclass(frozen=True)
class Analytic:
    """DESIGN §9's per-device figures (bytes) and per-step FLOPs, for the cross-check."""

    master: float  # policy weights (param dtype)
    adam: float  # two moments
    grads: float  # gradient + micro-batch accumulator
    reference: float
    sampling_copy: float
    kv_cache: float  # whole rollout, per device
    activations: float  # one micro-batch of the update, remat "full" model
    flops: float

    @property
    def update_peak(self) -> float:
        return self.master + self.adam + self.grads + self.reference + self.activations


def analytic(c: Any, *, n_params: int, rows: int, prompt: int, response: int, group: int,
             devices: int, param_shards: int, sample_shards: int, param_bytes: int,
             ref_bytes: int, sample_bytes: int, microbatches: int, remat: str,
             logits_chunk: int, sample_rows: int, trained: int | None = None) -> Analytic:
    """DESIGN §9 for `rows` = B·G rollout rows of `prompt` + `response` tokens on `devices`
    devices (params over `param_shards` = fsdp × tensor, the sampler's over `sample_shards`),
    sampled `sample_rows` rows per sampler call (the KV cache is one call's). `trained`: LoRA's
    adapter parameter count (fp32, with Adam moments and gradients); the base is then frozen
    and is itself the reference (no copy)."""
    n, t = n_params, prompt + response
    kv_row = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2  # bytes/token
    kv = kv_row * (sample_rows * response + sample_rows // group * prompt) / devices
    rows_dev = max(rows / microbatches / devices, 1.0)
    layer_inputs = c.num_hidden_layers * t * c.hidden_size * 2
    if remat != "full":  # "dots"/"none" keep every layer's matmul outputs: ~(q,k,v,o,3 MLP)
        per_layer = t * (2 * c.hidden_size + 2 * c.num_key_value_heads * c.head_dim
                         + c.num_attention_heads * c.head_dim + 3 * c.intermediate_size) * 2
        layer_inputs += c.num_hidden_layers * per_layer
    logits = (logits_chunk or t) * c.vocab_size * 4
    act = rows_dev * (layer_inputs + logits)
    tokens = rows * response
    update_per_token = 8 if remat == "full" else 6
    flops = (2 * n * (tokens + rows // group * prompt)  # generation (prefill + decode)
             + 2 * n * tokens  # reference scoring
             + update_per_token * n * tokens)
    m, ref = (n, n * ref_bytes) if trained is None else (trained, 0)
    master = n * param_bytes + (0 if trained is None else 4 * trained)
    return Analytic(master=master / param_shards, adam=8 * m / param_shards,
                    grads=2 * 4 * m / param_shards, reference=ref / param_shards,
                    sampling_copy=n * sample_bytes / sample_shards, kv_cache=kv,
                    activations=act, flops=flops)
