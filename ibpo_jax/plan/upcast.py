"""How much XLA:CPU's temporaries overstate a bfloat16 program: `python -m ibpo_jax.plan.upcast`.

A GPU/TPU compile keeps bfloat16 activations in bfloat16; XLA:CPU may compute bf16 ops in
float32 and keep float32 temporaries. The plan compiles on CPU, so this compiles one small
program both ways on CPU, the gradient of a Qwen3-0.6B-wide model's token log-probs (2
layers, `rows` x `tokens`, remat "full", chunked attention, 512-position logit chunks), with
compute dtype bfloat16 and float32, and prints the temporaries of each: a GPU's bf16
activations take half the bytes of float32 ones, so bf16 / f32 well above 0.5 is XLA:CPU
upcasting, and the plan's figures are that much above what a GPU would need (an upper bound).
"""

from __future__ import annotations

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp

from ibpo_jax import models


def temp_bytes(dtype: str, *, rows: int = 4, tokens: int = 2048, layers: int = 2) -> int:
    """Temporaries of the compiled gradient (bytes) with compute dtype `dtype`."""
    c = dataclasses.replace(models.QWEN3_PRESETS["qwen3-0.6b"], num_hidden_layers=layers)
    fields = {f.name for f in dataclasses.fields(models.ModelOptions)}
    extra = {"attention": "chunked"} if "attention" in fields else {}
    opts = models.make_options(jnp.dtype(dtype), param_dtype=jnp.float32, remat="full",
                               scan_layers=True, **extra)
    params = models.abstract_params(c, opts)
    toks = jax.ShapeDtypeStruct((rows, tokens), jnp.int32)

    def loss(p, t):
        return models.token_logprobs(c, opts, p, t, logits_chunk=512).logprobs.sum()

    compiled = jax.jit(jax.grad(loss)).lower(params, toks).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def main() -> int:
    bf16, f32 = temp_bytes("bfloat16"), temp_bytes("float32")
    print(json.dumps({"backend": jax.default_backend(), "temp_bf16": bf16, "temp_f32": f32,
                      "ratio_bf16_over_f32": bf16 / f32}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
