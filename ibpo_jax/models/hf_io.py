"""HF checkpoints in and out: `load_hf` and `save_hf`.

Loading never materializes the model on one device: the params are built abstractly
(`jax.eval_shape`), each parameter's NamedSharding is computed, and each device's shard is read
straight from the memory-mapped safetensors bytes by `jax.make_array_from_callback` (a shard
reads only its own rows/columns, and only the devices of this process are read for).

Name and layout mapping (torch Linear weights are [out, in]; ours are [in, out] with heads
split out): q_proj [N*H, D] -> [D, N, H]; k/v_proj [K*H, D] -> [D, K, H]; o_proj [D, N*H] ->
[N, H, D]; gate/up_proj [F, D] -> [D, F]; down_proj [D, F] -> [F, D]; lm_head [V, D] -> [D, V];
embeddings and norm weights unchanged. With `scan_layers` every layer weight is stacked on a
leading [L] axis. The value head, which HF's causal LM lacks, lives in `value_head.safetensors`
next to the model files.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding

from ibpo_jax.models import safetensors_io as st
from ibpo_jax.models.config import Qwen3Config
from ibpo_jax.models.lm import Qwen3LM, abstract_params, make_options
from ibpo_jax.models.safetensors_io import HFCheckpointError
from ibpo_jax.runtime import sharding

VALUE_HEAD_FILE = "value_head.safetensors"
GENERATION_FILE = "generation_config.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30
# Tensors some HF checkpoints carry that hold nothing we need.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


class _Rule(NamedTuple):
    """How one HF tensor maps onto (one layer of) one of our parameters."""

    hf: str  # name template; {i} = layer
    perm: tuple[int, ...] | None  # transpose of the (split) HF tensor into our layout
    split: tuple[int, ...] | None = None  # the HF tensor's heads split out: its view shape
    hf_shape: tuple[int, ...] | None = None  # the HF shape when `split` is set


def _rules(c: Qwen3Config) -> dict[str, _Rule]:
    n, k, h, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
    att, mlp = "model.layers.{i}.self_attn.", "model.layers.{i}.mlp."
    return {
        "embedding": _Rule("model.embed_tokens.weight", None),
        "final_norm": _Rule("model.norm.weight", None),
        "lm_head": _Rule("lm_head.weight", (1, 0)),
        "value_head": _Rule("value_head.weight", None),
        "value_bias": _Rule("value_head.bias", None),
        "attn/q_proj": _Rule(att + "q_proj.weight", (2, 0, 1), (n, h, d), (n * h, d)),
        "attn/k_proj": _Rule(att + "k_proj.weight", (2, 0, 1), (k, h, d), (k * h, d)),
        "attn/v_proj": _Rule(att + "v_proj.weight", (2, 0, 1), (k, h, d), (k * h, d)),
        "attn/o_proj": _Rule(att + "o_proj.weight", (1, 2, 0), (d, n, h), (d, n * h)),
        "attn/q_norm": _Rule(att + "q_norm.weight", None),
        "attn/k_norm": _Rule(att + "k_norm.weight", None),
        "mlp/gate_proj": _Rule(mlp + "gate_proj.weight", (1, 0)),
        "mlp/up_proj": _Rule(mlp + "up_proj.weight", (1, 0)),
        "mlp/down_proj": _Rule(mlp + "down_proj.weight", (1, 0)),
        "input_norm": _Rule("model.layers.{i}.input_layernorm.weight", None),
        "post_attn_norm": _Rule("model.layers.{i}.post_attention_layernorm.weight", None),
    }


class _Leaf(NamedTuple):
    """One of our parameters and where its values come from."""

    path: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    rule: _Rule
    layers: tuple[int, ...] | None  # stacked layers (scan_layers), else None
    layer: int | None  # the layer of an unstacked layer weight


def _leaves(config: Qwen3Config, params_shape: Any) -> list[_Leaf]:
    rules = _rules(config)
    out = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(params_shape):
        keys = tuple(str(getattr(p, "key", p)) for p in path)
        head, rest = keys[0], "/".join(keys[1:])
        if head == "layers":  # scanned: [L, ...]
            out.append(_Leaf(keys, leaf.shape, leaf.dtype, rules[rest],
                             tuple(range(config.num_hidden_layers)), None))
        elif head.startswith("layers_"):
            out.append(_Leaf(keys, leaf.shape, leaf.dtype, rules[rest], None,
                             int(head.split("_")[1])))
        else:
            out.append(_Leaf(keys, leaf.shape, leaf.dtype, rules[head], None, None))
    return out


def _hf_shape(rule: _Rule, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The HF shape of (one layer of) a parameter of our `shape`."""
    if rule.split is not None:
        return rule.hf_shape
    if rule.perm is None:
        return tuple(shape)
    return tuple(shape[i] for i in np.argsort(rule.perm))


def _read(info: st.TensorInfo, rule: _Rule, index: tuple[slice, ...], dtype: np.dtype
          ) -> np.ndarray:
    """Our-layout slice `index` of one HF tensor, reading only the bytes it covers."""
    arr = st.open_tensor(info)
    if rule.split is not None:
        arr = arr.reshape(rule.split)
    if rule.perm is not None:
        view_index = [slice(None)] * arr.ndim
        for ours, theirs in enumerate(rule.perm):
            view_index[theirs] = index[ours]
        return np.asarray(arr[tuple(view_index)]).transpose(rule.perm).astype(dtype)
    return np.asarray(arr[index]).astype(dtype)


def _load_leaf(leaf: _Leaf, tensors: dict[str, st.TensorInfo], target: Any) -> jax.Array:
    names = ([leaf.rule.hf.format(i=i) for i in leaf.layers] if leaf.layers is not None
             else [leaf.rule.hf.format(i=leaf.layer)])
    one_shape = leaf.shape[1:] if leaf.layers is not None else leaf.shape
    want = _hf_shape(leaf.rule, one_shape)
    for name in names:
        if name not in tensors:
            raise HFCheckpointError(f"tensor {name} is missing from the checkpoint "
                                  f"(needed for parameter {'/'.join(leaf.path)})")
        if tensors[name].shape != want:
            raise HFCheckpointError(f"tensor {name} has shape {tensors[name].shape}, the config "
                                  f"implies {want}")
    cache: dict[tuple, np.ndarray] = {}  # replicated shards read once

    def callback(index):
        index = tuple(slice(*s.indices(n)) for s, n in zip(index, leaf.shape))
        key = tuple((s.start, s.stop, s.step) for s in index)
        if key not in cache:
            if leaf.layers is None:
                cache[key] = _read(tensors[names[0]], leaf.rule, index, leaf.dtype)
            else:
                cache[key] = np.stack([_read(tensors[names[i]], leaf.rule, index[1:], leaf.dtype)
                                       for i in range(*index[0].indices(len(names)))])
        return cache[key]

    return jax.make_array_from_callback(leaf.shape, target, callback)


def load_hf(path: str | os.PathLike, *, dtype: Any = jnp.float32, mesh: Mesh | None = None,
            layout: sharding.ShardingSpec = sharding.TRAINING, **options: Any) -> Qwen3LM:
    """A `Qwen3LM` from an HF Qwen3 checkpoint directory (config.json + safetensors, single
    file or sharded with an index).

    dtype: compute and parameter dtype (weights are converted while read); `options`: the
    other `ModelOptions` fields (param_dtype, remat, scan_layers, value_head). With a mesh each
    parameter is placed straight on its `layout` sharding. With value_head and no
    value_head.safetensors in `path`, the head starts at its random-free init (zero weights).
    Raises ArchitectureError (bad config.json) or HFCheckpointError naming the offending tensor.
    """
    path = os.fspath(path)
    config = Qwen3Config.from_hf(path)
    opts = make_options(dtype, **options)
    params_shape = abstract_params(config, opts)
    shardings = (sharding.param_shardings(params_shape, mesh, layout) if mesh is not None
                 else jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]),
                                   params_shape))
    tensors = st.read_checkpoint_index(path)
    value_file = os.path.join(path, VALUE_HEAD_FILE)
    if opts.value_head and os.path.exists(value_file):
        tensors.update(st.read_header(value_file))
    leaves = _leaves(config, params_shape)
    flat_shardings = jax.tree.leaves(shardings)
    arrays, used = [], set()
    for leaf, target in zip(leaves, flat_shardings):
        if leaf.path[0] in ("value_head", "value_bias") and leaf.rule.hf not in tensors:
            arrays.append(jax.device_put(np.zeros(leaf.shape, leaf.dtype), target))
            continue
        arrays.append(_load_leaf(leaf, tensors, target))
        used.update([leaf.rule.hf.format(i=i) for i in (leaf.layers or (leaf.layer,))])
    extra = sorted(n for n in tensors if n not in used and not n.endswith(_IGNORED_SUFFIXES)
                   and not (n == "lm_head.weight" and config.tie_word_embeddings)
                   and not n.startswith("value_head."))
    if extra:
        raise HFCheckpointError(f"tensor {extra[0]} in the checkpoint is not part of a Qwen3 "
                              f"model with this config ({len(extra)} unexpected tensors: "
                              f"{', '.join(extra[:5])})")
    params = jax.tree.unflatten(jax.tree.structure(params_shape), arrays)
    return Qwen3LM(config, opts, params, mesh, layout)


def _hf_tensor(x: np.ndarray, rule: _Rule) -> np.ndarray:
    """Inverse of the load mapping for one layer: our layout -> HF layout."""
    hf_shape = _hf_shape(rule, x.shape)
    if rule.perm is not None:
        x = x.transpose(np.argsort(rule.perm))
    return x.reshape(hf_shape)


def hf_tensors(config: Qwen3Config, params: Any) -> Iterator[tuple[str, np.ndarray]]:
    """(HF tensor name, value in HF layout) for every tensor of `params` (or of a params-shaped
    pytree such as its gradients), one layer at a time, gathered to the host."""
    for leaf, arr in zip(_leaves(config, params), jax.tree.leaves(params)):
        for pos, i in enumerate(leaf.layers if leaf.layers is not None else (leaf.layer,)):
            x = sharding.host_array(arr[pos] if leaf.layers is not None else arr)
            yield leaf.rule.hf.format(i=i), _hf_tensor(x, leaf.rule)


def save_hf(m: Qwen3LM, path: str | os.PathLike, *,
            max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
            config_extra: dict[str, Any] | None = None) -> None:
    """Writes `m` as an HF checkpoint directory (config.json, model.safetensors or
    model-0000k-of-0000n.safetensors + index above `max_shard_bytes`) that
    `transformers.AutoModelForCausalLM.from_pretrained` loads. Tensors keep the params' dtype;
    `config_extra` adds keys to config.json (the token ids of `special_ids`).

    Tensors are gathered to the host one (layer) at a time and streamed to disk; every process
    must call this (gathers are collective), process 0 writes.
    """
    path = os.fspath(path)
    write = jax.process_index() == 0
    if write:
        os.makedirs(path, exist_ok=True)
    model_plan, value_plan = [], []
    for leaf, arr in zip(_leaves(m.config, m.params), jax.tree.leaves(m.params)):
        one_shape = leaf.shape[1:] if leaf.layers is not None else leaf.shape
        hf_shape = _hf_shape(leaf.rule, one_shape)
        stacked = leaf.layers is not None
        for pos, i in enumerate(leaf.layers if stacked else (leaf.layer,)):
            def produce(arr=arr, pos=pos, rule=leaf.rule, stacked=stacked):
                return _hf_tensor(sharding.host_array(arr[pos] if stacked else arr), rule)

            planned = st.PlannedTensor(leaf.rule.hf.format(i=i), hf_shape, np.dtype(leaf.dtype),
                                       produce)
            (value_plan if leaf.path[0].startswith("value_") else model_plan).append(planned)
    shards: list[list[st.PlannedTensor]] = [[]]
    size = 0
    for t in model_plan:
        nbytes = t.dtype.itemsize * int(np.prod(t.shape))
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))])
    total = 0
    for name, shard in zip(names, shards):
        total += st.write_file(os.path.join(path, name), shard, write=write)
    if value_plan:
        st.write_file(os.path.join(path, VALUE_HEAD_FILE), value_plan, write=write)
    if not write:
        return
    if len(shards) > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {t.name: name for name, shard in zip(names, shards)
                                for t in shard}}
        with open(os.path.join(path, "model.safetensors.index.json"), "w",
                  encoding="utf-8") as f:
            json.dump(index, f, indent=2)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump({**m.config.to_hf_dict(dtype=m.options.param_dtype), **(config_extra or {})},
                  f, indent=2)


def special_ids(tokenizer: Any) -> dict[str, Any]:
    """The token ids config.json and generation_config.json carry, of a tokenizer of the
    protocol in `ibpo_jax.data.tokenizer` (several end ids: a list, as HF writes them)."""
    eos = list(tokenizer.eos_ids)
    return {"bos_token_id": tokenizer.bos_id, "pad_token_id": tokenizer.pad_id,
            "eos_token_id": eos[0] if len(eos) == 1 else eos}


def save_tokenizer(tokenizer: Any, path: str | os.PathLike) -> None:
    """Writes beside an HF export (`save_hf`) the files that make it usable on its own: the
    tokenizer (an HF tokenizer: its own files, chat template included; another: its `to_hf()`,
    e.g. `CharTokenizer.to_hf`) and generation_config.json (the source checkpoint's
    when the tokenizer was read from one that has it, else the tokenizer's end and pad ids, so
    `generate` stops at the end of a reply). Process 0 writes."""
    if jax.process_index() != 0:
        return
    path = os.fspath(path)
    hf_tokenizer = getattr(tokenizer, "tokenizer", None)  # ibpo_jax.data.hf.HFTokenizer
    (hf_tokenizer or tokenizer.to_hf()).save_pretrained(path)
    source = os.path.join(getattr(hf_tokenizer, "name_or_path", "") or "", GENERATION_FILE)
    target = os.path.join(path, GENERATION_FILE)
    if hf_tokenizer is not None and os.path.isfile(source):
        shutil.copyfile(source, target)
        return
    with open(target, "w", encoding="utf-8") as f:
        json.dump(special_ids(tokenizer), f, indent=2)
