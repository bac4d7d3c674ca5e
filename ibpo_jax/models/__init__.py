"""Qwen3 dense models: config and presets, flax modules, HF checkpoint io.

    m = ibpo_jax.models.load_hf(path, dtype=jnp.bfloat16, mesh=mesh)
    logits = m(tokens, attention_mask=mask)          # [B, T, V] float32
    ibpo_jax.models.save_hf(m, out_dir)              # loads back in transformers

Inside jitted training code use the functional forms `forward` / `token_logprobs` /
`response_logprobs` / `final_hidden` with params as arguments.
"""

from ibpo_jax.models.config import QWEN3_PRESETS, ArchitectureError, ModelOptions, Qwen3Config
from ibpo_jax.models.hf_io import load_hf, save_hf
from ibpo_jax.models.lm import (
    Qwen3LM,
    TokenLogprobs,
    abstract_params,
    final_hidden,
    forward,
    init,
    make_options,
    place_params,
    response_logprobs,
    token_logprobs,
)
from ibpo_jax.models.safetensors_io import HFCheckpointError

__all__ = [
    "QWEN3_PRESETS", "HFCheckpointError", "ArchitectureError", "ModelOptions", "Qwen3Config",
    "Qwen3LM", "TokenLogprobs", "abstract_params", "final_hidden", "forward", "init",
    "load_hf", "make_options", "place_params", "response_logprobs", "save_hf",
    "token_logprobs",
]
