"""Qwen3 architecture config (HF `config.json` field names), published presets, runtime options.

`Qwen3Config` holds only what fixes the weights and the math; how the model is run (dtypes,
rematerialization, scanning over layers, a value head) lives in `ModelOptions`, so one checkpoint
can be run many ways and both stay hashable (they are static arguments of jitted functions).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np


class ArchitectureError(ValueError):
    """A config.json (or dict) that does not describe a Qwen3 dense model we can run."""


# transformers' Qwen3Config for absent keys; an explicit null num_key_value_heads means MHA.
_HF_DEFAULTS = {"num_key_value_heads": 32, "head_dim": 128}


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """The architecture of a Qwen3 dense decoder; field names as in HF `config.json`."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02  # std of the normal init of `models.init`, as in HF

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ArchitectureError(f"Qwen3Config.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ArchitectureError(
                f"Qwen3Config.num_attention_heads={self.num_attention_heads} is not a multiple "
                f"of num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ArchitectureError(f"Qwen3Config.head_dim={self.head_dim} must be even "
                                    "(RoPE halves)")
        for name in ("rms_norm_eps", "rope_theta", "initializer_range"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
                    or not value > 0:
                raise ArchitectureError(f"Qwen3Config.{name} must be a number > 0, got {value!r}")

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (GQA ratio)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf(cls, source: str | os.PathLike | Mapping[str, Any]) -> Qwen3Config:
        """From an HF checkpoint directory, a config.json path or its parsed dict.

        Accepts both the transformers<5 spelling (`rope_theta` at top level) and the >=5 one
        (`rope_parameters.rope_theta`). Raises `ArchitectureError` naming the field for anything
        this model does not implement (biases, sliding window, RoPE scaling, another model type).
        """
        if isinstance(source, Mapping):
            d = dict(source)
        else:
            path = os.fspath(source)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            try:
                with open(path, encoding="utf-8") as f:
                    d = json.load(f)
            except FileNotFoundError:
                raise ArchitectureError(f"no HF config at {path}") from None
            except json.JSONDecodeError as e:
                raise ArchitectureError(f"{path} is not valid JSON: {e}") from None
        where = "config" if isinstance(source, Mapping) else os.fspath(source)

        def need(field: str, ok: bool, msg: str):
            if not ok:
                raise ArchitectureError(f"{where}: field {field!r} {msg}")

        need("model_type", d.get("model_type", "qwen3") == "qwen3",
             f"is {d.get('model_type')!r}, expected 'qwen3'")
        need("hidden_act", d.get("hidden_act", "silu") == "silu", "must be 'silu'")
        need("attention_bias", not d.get("attention_bias", False), "must be false")
        need("use_sliding_window", not d.get("use_sliding_window", False),
             "must be false (sliding-window attention is not implemented)")
        rope = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        need("rope_parameters.rope_type", rope_type == "default",
             f"is {rope_type!r}; only plain RoPE is implemented")
        theta = rope.get("rope_theta", d.get("rope_theta"))
        need("rope_theta", theta is not None, "is missing")
        need("rope_theta", isinstance(theta, (int, float)) and not isinstance(theta, bool),
             f"must be a number, got {theta!r}")
        kwargs = {}
        for field in dataclasses.fields(cls):
            if field.name == "rope_theta":
                continue
            if field.name in d and d[field.name] is not None:
                kwargs[field.name] = d[field.name]
            elif field.name == "num_key_value_heads" and field.name in d:  # null: MHA
                kwargs[field.name] = d.get("num_attention_heads")
            elif field.name in _HF_DEFAULTS and field.name not in d:
                kwargs[field.name] = _HF_DEFAULTS[field.name]
            elif field.default is dataclasses.MISSING:
                need(field.name, False, "is missing")
        try:
            return cls(rope_theta=float(theta), **kwargs)
        except (ArchitectureError, TypeError, ValueError) as e:  # name the file and the field
            raise ArchitectureError(f"{where}: {e}") from None

    def to_hf_dict(self, *, dtype: Any = jnp.float32) -> dict[str, Any]:
        """The config.json dict of an equivalent `Qwen3ForCausalLM` (params stored in `dtype`).

        Writes RoPE both ways (`rope_theta` and `rope_parameters`) so transformers 4.5x and 5.x
        read the same value.
        """
        d = dataclasses.asdict(self)
        dtype_name = jnp.dtype(dtype).name
        d.update(
            architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu",
            attention_bias=False, attention_dropout=0.0, use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            torch_dtype=dtype_name, dtype=dtype_name, use_cache=True,
        )
        return d

    def num_params(self, *, value_head: bool = False) -> int:
        """Exact parameter count (embeddings counted once when tied)."""
        d, h, f = self.hidden_size, self.head_dim, self.intermediate_size
        n, k, v = self.num_attention_heads, self.num_key_value_heads, self.vocab_size
        per_layer = d * n * h * 2 + d * k * h * 2 + 3 * d * f + 2 * d + 2 * h
        total = self.num_hidden_layers * per_layer + v * d + d
        total += 0 if self.tie_word_embeddings else v * d
        return total + (d + 1 if value_head else 0)


def _preset(hidden, inter, layers, heads, tied) -> Qwen3Config:
    return Qwen3Config(vocab_size=151936, hidden_size=hidden, intermediate_size=inter,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=8,
                       head_dim=128, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
                       max_position_embeddings=40960, tie_word_embeddings=tied)


# The published Qwen/Qwen3-* config.json values (dense models).
QWEN3_PRESETS: dict[str, Qwen3Config] = {
    "qwen3-0.6b": _preset(1024, 3072, 28, 16, True),
    "qwen3-1.7b": _preset(2048, 6144, 28, 16, True),
    "qwen3-4b": _preset(2560, 9728, 36, 32, True),
    "qwen3-8b": _preset(4096, 12288, 36, 32, False),
    "qwen3-14b": _preset(5120, 17408, 40, 40, False),
    "qwen3-32b": _preset(5120, 25600, 64, 64, False),
}

REMAT_POLICIES = ("none", "full", "dots")
# The kernels of `attention.self_attention` (ModelOptions.attention).
ATTENTION_IMPLEMENTATIONS = ("auto", "cudnn", "splash", "chunked", "dense")


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """How to run a `Qwen3Config` (not stored in checkpoints).

    dtype: compute dtype of activations and matmul inputs (softmax, log-softmax, norms and the
      logits are always float32). param_dtype: storage dtype of the weights.
    remat: "none"; "full" (recompute each decoder layer in the backward pass); "dots" (keep the
      outputs of weight matmuls, recompute the rest).
    scan_layers: stack layer weights on a leading [L] axis and `lax.scan` over them (compile time
      independent of depth); otherwise a Python loop with weights under `layers_{i}`.
    value_head: a scalar head on the final hidden state (PPO critic / PRM), `values` [B, T].
    attention: the kernel of whole-sequence attention (`attention.self_attention`): "auto"
      (cudnn on GPU for 16-bit dtypes, splash on TPU, dense or chunked on CPU by length),
      "cudnn", "splash", "chunked" (blockwise XLA, memory linear in length) or "dense".
    attention_block_q, attention_block_kv: the tiles of "chunked" (query rows, keys).
    lora_rank, lora_alpha: LoRA (`models.lora`): the trained params are adapters of this rank
      over a frozen base, scaled by alpha / rank; 0 = off (the whole model is trained). The
      model adds whatever adapters its params hold; this says how the trainer splits them.
    lora_dropout: dropout rate on the adapters' input (`lora.dropout`), applied only in an
      apply given a `qwen3.DROPOUT_RNG` key (the update's gradient passes); 0 = off.
    """

    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    remat: str = "none"
    scan_layers: bool = False
    value_head: bool = False
    attention: str = "auto"
    attention_block_q: int = 512
    attention_block_kv: int = 512
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0

    def __post_init__(self):
        for name in ("dtype", "param_dtype"):
            dt = jnp.dtype(getattr(self, name))
            if not jnp.issubdtype(dt, jnp.floating):
                raise ArchitectureError(f"ModelOptions.{name} must be a float dtype, got {dt}")
            object.__setattr__(self, name, dt)
        if self.remat not in REMAT_POLICIES:
            raise ArchitectureError(f"ModelOptions.remat={self.remat!r}; valid: {REMAT_POLICIES}")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ArchitectureError(f"ModelOptions.attention={self.attention!r}; valid: "
                              f"{ATTENTION_IMPLEMENTATIONS}")
        for name in ("attention_block_q", "attention_block_kv"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ArchitectureError(f"ModelOptions.{name} must be a positive int, got "
                                        f"{value!r}")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, (int, np.integer)) \
                or self.lora_rank < 0:
            raise ArchitectureError(f"ModelOptions.lora_rank must be an int >= 0, got "
                                    f"{self.lora_rank!r}")
        if not 0 <= self.lora_dropout < 1:
            raise ArchitectureError(f"ModelOptions.lora_dropout must be in [0, 1), got "
                              f"{self.lora_dropout!r}")
