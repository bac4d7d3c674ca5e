"""HF checkpoint io: load_hf / save_hf against transformers and the safetensors library,
sharded loading on a mesh of 8 fake CPU devices, and clear errors for broken checkpoints."""

import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from jax.sharding import NamedSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from ibpo_jax import models
from ibpo_jax.models import ArchitectureError, HFCheckpointError, hf_io
from ibpo_jax.runtime import sharding
from tests.models.hf_helpers import hf_logits, hf_model, left_padded_batch, saved


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch(np.random.default_rng(0), (7, 4, 6), vocab=128)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    hf = hf_model(tie_word_embeddings=True, num_key_value_heads=4, head_dim=24)
    return hf, saved(hf, tmp_path_factory.mktemp("tied"))


@pytest.fixture(scope="module")
def untied_sharded(tmp_path_factory):
    hf = hf_model(seed=1)
    path = saved(hf, tmp_path_factory.mktemp("sharded"), max_shard_size="40KB")
    return hf, path


def _close(m, hf, batch):
    tokens, mask = batch
    valid = mask.astype(bool)
    return np.abs(np.asarray(m(tokens, mask)) - hf_logits(hf, tokens, mask))[valid].max()


def test_load_single_file_checkpoint_saved_by_transformers(tied, batch):
    hf, path = tied
    assert os.listdir(path).count("model.safetensors") == 1
    assert _close(models.load_hf(path), hf, batch) <= 1e-4


def test_load_sharded_checkpoint_with_index_saved_by_transformers(untied_sharded, batch):
    hf, path = untied_sharded
    assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
    assert len([f for f in os.listdir(path) if f.endswith(".safetensors")]) > 1
    assert _close(models.load_hf(path), hf, batch) <= 1e-4


def _safetensors_dir(path):
    out = {}
    for f in sorted(os.listdir(path)):
        if f.startswith("model") and f.endswith(".safetensors"):
            with safe_open(os.path.join(path, f), framework="pt") as st:
                out.update({k: st.get_tensor(k) for k in st.keys()})
    return out


@pytest.mark.parametrize("scan_layers", [False, True])
def test_save_hf_round_trips_through_transformers(untied_sharded, batch, tmp_path, scan_layers):
    hf, path = untied_sharded
    m = models.load_hf(path, scan_layers=scan_layers)
    models.save_hf(m, tmp_path, max_shard_bytes=60_000)
    files = [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]
    assert len(files) > 1 and os.path.exists(tmp_path / "model.safetensors.index.json")
    # The safetensors library reads our files back bit for bit.
    written = _safetensors_dir(tmp_path)
    assert written.keys() == dict(hf.named_parameters()).keys()
    for name, p in hf.named_parameters():
        assert torch.equal(written[name], p.detach()), name
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert _close(m, back, batch) <= 1e-4
    assert _close(models.load_hf(tmp_path), hf, batch) <= 1e-4


def test_save_tied_model_single_file(tied, batch, tmp_path):
    hf, path = tied
    models.save_hf(models.load_hf(path), tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    assert "lm_head.weight" not in _safetensors_dir(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert back.config.tie_word_embeddings
    assert _close(models.load_hf(tmp_path), back, batch) <= 1e-4


def test_bfloat16_checkpoint_round_trip(tied, tmp_path):
    _, path = tied
    m = models.load_hf(path, dtype=jnp.bfloat16)
    models.save_hf(m, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with safe_open(os.path.join(tmp_path, "model.safetensors"), framework="pt") as st:
        emb = st.get_tensor("model.embed_tokens.weight")
    assert emb.dtype == torch.bfloat16
    np.testing.assert_array_equal(emb.float().numpy(),
                                  np.asarray(m.params["embedding"], np.float32))
    again = models.load_hf(tmp_path, dtype=jnp.bfloat16)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a, np.float32),
                                                            np.asarray(b, np.float32)),
                 again.params, m.params)


def test_value_head_round_trip(tied, tmp_path):
    _, path = tied
    m = models.load_hf(path, value_head=True)
    assert float(jnp.abs(m.params["value_head"]).sum()) == 0.0  # no file yet: zero head
    params = dict(m.params, value_head=jnp.arange(64, dtype=jnp.float32) / 64,
                  value_bias=jnp.float32(0.25))
    models.save_hf(models.Qwen3LM(m.config, m.options, params), tmp_path)
    again = models.load_hf(tmp_path, value_head=True)
    np.testing.assert_array_equal(again.params["value_head"], params["value_head"])
    assert float(again.params["value_bias"]) == 0.25
    assert "value_head.weight" not in _safetensors_dir(tmp_path)  # HF files stay pure


def test_load_on_a_mesh_reads_only_each_devices_shard(untied_sharded, batch, monkeypatch):
    hf, path = untied_sharded
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    reads = []
    real_read = hf_io._read

    def recording_read(info, rule, index, dtype):
        out = real_read(info, rule, index, dtype)
        reads.append((info.shape, out.size))
        return out

    monkeypatch.setattr(hf_io, "_read", recording_read)
    m = models.load_hf(path, mesh=mesh)
    for path_keys, leaf in jax.tree_util.tree_leaves_with_path(m.params):
        keys = tuple(str(k.key) for k in path_keys)
        spec = sharding.param_spec(keys, leaf.ndim, sharding.TRAINING)
        assert leaf.sharding == NamedSharding(mesh, spec), keys
        divisor = 1
        for entry in spec:
            divisor *= sharding._axis_size(mesh, entry)
        assert {s.data.size for s in leaf.addressable_shards} == {leaf.size // divisor}
    # Sharded weights (fsdp x tensor = 4 ways here) were read a quarter at a time; only the
    # small replicated vectors were read whole.
    full = [size for shape, size in reads if size == int(np.prod(shape))]
    assert all(len(shape) == 1 for shape, size in reads if size == int(np.prod(shape)))
    assert len(full) < len(reads)
    assert all(size * 4 == int(np.prod(shape)) for shape, size in reads if len(shape) == 2)
    assert _close(m, hf, batch) <= 1e-4


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _rewrite(path, change):
    file = os.path.join(path, "model.safetensors")
    with safe_open(file, framework="numpy") as st:
        tensors = {k: st.get_tensor(k) for k in st.keys()}
    change(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def test_missing_tensor_is_named(tied, tmp_path):
    path = _copy(tied[1], tmp_path / "c")
    _rewrite(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(HFCheckpointError,
                       match=r"model\.layers\.1\.mlp\.up_proj\.weight is missing"):
        models.load_hf(path)


def test_unexpected_tensor_is_named(tied, tmp_path):
    path = _copy(tied[1], tmp_path / "c")
    _rewrite(path, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias":
                                       np.zeros(96, np.float32)}))
    with pytest.raises(HFCheckpointError, match=r"model\.layers\.0\.self_attn\.q_proj\.bias"):
        models.load_hf(path)


def test_wrong_shape_from_a_wrong_config_is_named(tied, tmp_path):
    path = _copy(tied[1], tmp_path / "c")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 100}))
    with pytest.raises(HFCheckpointError,
                       match=r"model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight has shape"):
        models.load_hf(path)


def test_config_with_more_layers_than_the_checkpoint(tied, tmp_path):
    path = _copy(tied[1], tmp_path / "c")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    with pytest.raises(HFCheckpointError, match=r"model\.layers\.2\.\S+ is missing"):
        models.load_hf(path)


def test_truncated_file_is_named(tied, tmp_path):
    path = _copy(tied[1], tmp_path / "c")
    file = path / "model.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.raises(HFCheckpointError, match=r"tensor \S+ in .*past the end of the file"):
        models.load_hf(path)
    file.write_bytes(b"\x01")
    with pytest.raises(HFCheckpointError, match="truncated"):
        models.load_hf(path)


def test_corrupt_index_and_header_entries_are_named(tied, tmp_path):
    path = _copy(tied[1], tmp_path / "c")
    index = path / "model.safetensors.index.json"
    index.write_text("{not json")
    with pytest.raises(HFCheckpointError, match=r"model\.safetensors\.index\.json: not a "):
        models.load_hf(path)
    index.write_text(json.dumps({"metadata": {}}))  # no weight_map
    with pytest.raises(HFCheckpointError, match="weight_map"):
        models.load_hf(path)
    index.unlink()
    file = path / "model.safetensors"
    raw = file.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8: 8 + n])
    name = next(k for k in header if k != "__metadata__")
    del header[name]["dtype"]
    body = json.dumps(header, separators=(",", ":")).encode().ljust(n)  # same length
    file.write_bytes(raw[:8] + body + raw[8 + n:])
    with pytest.raises(HFCheckpointError, match=rf"tensor {re.escape(name)} in .*lacks a valid"):
        models.load_hf(path)


def test_wrong_model_type_is_a_config_error(tied, tmp_path):
    path = _copy(tied[1], tmp_path / "c")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(ArchitectureError, match="model_type"):
        models.load_hf(path)


def test_index_pointing_to_a_missing_shard(untied_sharded, tmp_path):
    path = _copy(untied_sharded[1], tmp_path / "c")
    victim = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))[0]
    os.remove(path / victim)
    with pytest.raises(HFCheckpointError, match=victim):
        models.load_hf(path)
