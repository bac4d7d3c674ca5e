"""LoRA adapters on the Qwen3 projections (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
Language Models", eq. 3: h = W0 x + (alpha / r) B A x, B initialised to 0).

Dropout (`dropout`, `ModelOptions.lora_dropout` > 0) acts on the adapter's input only, and
only in a pass given a "lora_dropout" rng (`qwen3.project`): the update's gradient passes.

The adapters are a params pytree of their own that mirrors the base's dicts and holds only
`{proj}_lora_a` [..., I, r] and `{proj}_lora_b` [..., r, O] leaves beside the adapted weight
`{proj}` (I, O: the weight's input and output axes flattened as `qwen3.dense` uses it; a
leading [L] with `scan_layers`). `merge` overlays them on the base: the model adds the adapter
of every weight whose `_lora_a` it finds (`qwen3.project`) and runs the base alone on the base
tree, which is how π_ref is "the policy with the adapters off" without a second copy.

Why our own adapter and not `qwix` (measured with qwix 0.1.8 on this model): qwix finds the
weight of an intercepted dot_general by the identity of its right operand with a module param,
and `qwen3.dense` reshapes every weight before its matmul (the 2-D form its gradients need), so
unrolled it adapted 2 of the 14 projections of a 2-layer model (one down_proj, and lm_head,
which we do not want) and under `nn.scan` none; its adapters take the base's dtype (no fp32
adapters on a bf16 base) and are created on first use, so the base cannot be run alone.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# target name -> (module, weight) in the params tree, and its HF/PEFT module path.
TARGETS = {
    "q": ("attn", "q_proj", "self_attn.q_proj"),
    "k": ("attn", "k_proj", "self_attn.k_proj"),
    "v": ("attn", "v_proj", "self_attn.v_proj"),
    "o": ("attn", "o_proj", "self_attn.o_proj"),
    "gate": ("mlp", "gate_proj", "mlp.gate_proj"),
    "up": ("mlp", "up_proj", "mlp.up_proj"),
    "down": ("mlp", "down_proj", "mlp.down_proj"),
}
A, B = "_lora_a", "_lora_b"
_IN_AXES = {"o_proj": 2}  # leading axes of a weight that are its input ([N, H, D]); others 1
_BASE_NDIM = {"q_proj": 3, "k_proj": 3, "v_proj": 3, "o_proj": 3}  # MLP weights: 2


def parse_targets(spec: str) -> tuple[str, ...]:
    """"q,v,down" -> ("q", "v", "down"); raises ValueError listing unknown names."""
    names = tuple(dict.fromkeys(t.strip() for t in spec.split(",") if t.strip()))
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        raise ValueError(f"unknown LoRA targets {unknown or [spec]}; valid: {', '.join(TARGETS)}")
    return names


def num_params(config: Any, rank: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters of a `Qwen3Config` at `rank`: r (I + O) per targeted weight."""
    c = config
    q, kv, d, f = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim,
                   c.hidden_size, c.intermediate_size)
    io = {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d), "gate": (d, f), "up": (d, f),
          "down": (f, d)}
    return c.num_hidden_layers * rank * sum(sum(io[t]) for t in targets)


def delta(x2: Array, a: Array, b: Array, alpha: float, dtype: Any) -> Array:
    """The adapter's term of a projection: x2 [M, I] -> (alpha / r) (x2 A) B [M, O] in
    `dtype` (a [I, r], b [r, O]; two thin matmuls, never the [I, O] product)."""
    scale = alpha / a.shape[-1]
    return ((x2 @ a.astype(dtype)) @ b.astype(dtype)) * jnp.asarray(scale, dtype)


def dropout(x: Array, *, key: Array, rate: float) -> Array:
    """Inverted dropout of the adapter's input (Hu et al. 2021 §4 / PEFT's `lora_dropout`):
    x [M, I] -> x * keep / (1 - rate), keep ~ Bernoulli(1 - rate) per entry, drawn from `key`
    at x's global shape (the repo's partitionable threefry: the same mask on any mesh).
    E[dropout(x)] = x, so (alpha / r) B A dropout(x) is unbiased for the adapter's term."""
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - rate), x.dtype), jnp.zeros((), x.dtype))


def _io(name: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], int, int]:
    """(leading stacked axes, I, O) of weight `name` of `shape`."""
    lead = len(shape) - _BASE_NDIM.get(name, 2)
    split = lead + _IN_AXES.get(name, 1)
    return shape[:lead], int(np.prod(shape[lead:split])), int(np.prod(shape[split:]))


def _targets_in(params: Any, targets: tuple[str, ...], suffix: str = ""):
    """(path of the weight's parent dict, weight name) of every targeted weight in `params`
    (with `suffix`: of its adapter leaves of that suffix)."""
    wanted = {(TARGETS[t][0], TARGETS[t][1] + suffix) for t in targets}
    for path, _ in jax.tree_util.tree_leaves_with_path(params):
        keys = tuple(str(getattr(k, "key", k)) for k in path)
        if len(keys) >= 2 and (keys[-2], keys[-1]) in wanted:
            yield keys[:-1], keys[-1]


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for k in path:
        tree = tree[k]
    return tree


def init(params: Any, *, rank: int, targets: tuple[str, ...], key: Array,
         dtype: Any = jnp.float32) -> dict:
    """Adapters of rank `rank` on the `targets` weights of base `params` (arrays or
    ShapeDtypeStructs): A ~ U(-1/sqrt(I), 1/sqrt(I)) (PEFT's Kaiming-uniform default), B = 0,
    so the adapted model equals the base until the first update."""
    out: dict = {}
    for n, (parent, name) in enumerate(_targets_in(params, targets)):
        lead, i, o = _io(name, _get(params, parent)[name].shape)
        node = out
        for k in parent:
            node = node.setdefault(k, {})
        bound = 1.0 / np.sqrt(i)
        node[name + A] = jax.random.uniform(jax.random.fold_in(key, n), (*lead, i, rank), dtype,
                                            -bound, bound)
        node[name + B] = jnp.zeros((*lead, rank, o), dtype)
    return out


def merge(base: Any, adapters: Any) -> Any:
    """The adapted model's params: `base`'s dicts with the adapters' leaves added (no copies)."""
    if not isinstance(adapters, dict):
        return adapters
    out = dict(base)
    for k, v in adapters.items():
        out[k] = merge(base[k], v) if k in base and isinstance(v, dict) else v
    return out


def fold(params: Any, alpha: float) -> Any:
    """Adapted params (`merge`d) -> plain base-shaped params with W + (alpha / r) A B in W's
    dtype (computed in float32): the merged checkpoint. Params without adapters pass through."""
    if not isinstance(params, dict):
        return params
    out = {k: fold(v, alpha) for k, v in params.items() if not k.endswith((A, B))}
    for k in list(out):
        if k + A in params:
            w, a, b = out[k], params[k + A], params[k + B]
            ab = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32)) * (alpha / a.shape[-1])
            out[k] = (w.astype(jnp.float32) + ab.reshape(w.shape)).astype(w.dtype)
    return out


def peft_tensors(adapters: Any) -> dict[str, np.ndarray]:
    """PEFT's tensors of `adapters` (gathered to the host): for layer i and module m,
    `base_model.model.model.layers.{i}.{m}.lora_A.weight` [r, I] and `.lora_B.weight` [O, r]
    (torch Linear weights: A^T and B^T of ours, I and O in HF's flattened order)."""
    out = {}
    for parent, name in _targets_in(adapters, tuple(TARGETS), A):
        proj = name[:-len(A)]
        hf = next(v[2] for v in TARGETS.values() if v[1] == proj)
        node = _get(adapters, parent)
        a, b = (np.asarray(jax.device_get(node[proj + s]), np.float32) for s in (A, B))
        layers = [(int(parent[0].split("_")[1]), a, b)] if parent[0] != "layers" else \
            [(i, a[i], b[i]) for i in range(a.shape[0])]
        for i, ai, bi in layers:
            stem = f"base_model.model.model.layers.{i}.{hf}"
            out[f"{stem}.lora_A.weight"] = np.ascontiguousarray(ai.T)
            out[f"{stem}.lora_B.weight"] = np.ascontiguousarray(bi.T)
    return out


def _walk_names(adapters: Any) -> set[str]:
    return {name[:-len(A)] for _, name in _targets_in(adapters, tuple(TARGETS), A)}


def save_peft(adapters: Any, path: str | os.PathLike, *, alpha: float, dropout: float = 0.0,
              base_model: str = "") -> None:
    """A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) that
    `peft.PeftModel.from_pretrained(Qwen3ForCausalLM, path)` loads (float32 tensors);
    `dropout` is the run's, for a user who trains the adapter on in PEFT. Every process must
    call it (gathers are collective); process 0 writes."""
    from ibpo_jax.models import safetensors_io as st

    tensors = peft_tensors(adapters)
    if jax.process_index() != 0:
        return
    os.makedirs(path, exist_ok=True)
    rank = next(iter(tensors.values())).shape[0] if tensors else 0
    st.write_file(os.path.join(path, "adapter_model.safetensors"),
                  [st.PlannedTensor(k, v.shape, v.dtype, lambda v=v: v)
                   for k, v in sorted(tensors.items())], write=True)
    config = dict(peft_type="LORA", task_type="CAUSAL_LM", r=rank, lora_alpha=alpha,
                  lora_dropout=dropout, bias="none", fan_in_fan_out=False, use_rslora=False,
                  inference_mode=True, base_model_name_or_path=base_model,
                  target_modules=sorted(_walk_names(adapters)))
    with open(os.path.join(path, "adapter_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
